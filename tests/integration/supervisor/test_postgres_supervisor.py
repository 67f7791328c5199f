"""`herdsman run` with its ledger on a real PostgreSQL server (``[store] url``).

The same story as the SQLite restart test, end to end: real processes, real
HTTP, the demo agent, a ``kill -9`` and a restart.
"""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest
from cli_support import CLI, Supervisor, herdsman
from supervisor_support import write_config

from herdsman.runtime.store import LOST_ON_RESTART, RunStatus
from herdsman.runtime.store.postgres import PostgresStore
from postgres_support import split_password


def configure(directory: Path, url: str, *, delay: float) -> None:
    write_config(directory, concurrency=1, delay=delay, extra=f'[store]\nurl = "{url}"\n')


def submit(directory: Path, run_id: str, *extra: str) -> str:
    result = herdsman(
        "submit", *CLI, "-p", "demo", "--id", run_id, "--conversation", run_id, *extra,
        f"prompt of {run_id}", cwd=directory,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_supervisor_on_postgres_runs_recovers_and_keeps_queue_order(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, password = split_password(postgres_url)
    if password is not None:  # the supervisors inherit it, as from a service's environment
        monkeypatch.setenv("PGPASSWORD", password)
    configure(tmp_path, url, delay=0.1)
    sup = Supervisor(tmp_path)
    try:
        assert "; ledger: PostgreSQL server " in sup.output()
        assert submit(tmp_path, "first", "--wait") == "demo reply: prompt of first\n\n"
        assert sup.stop(signal.SIGTERM) == 0
    finally:
        sup.close()

    configure(tmp_path, url, delay=30)
    sup = Supervisor(tmp_path)
    try:
        for n in range(4):
            submit(tmp_path, f"r{n}")
        deadline = time.monotonic() + 20
        while not (tmp_path / "state" / "logs" / "r0.log").exists():
            assert time.monotonic() < deadline, sup.output()
            time.sleep(0.05)
        sup.process.kill()  # no cleanup at all: r0 stays running in the ledger
        sup.process.wait()
    finally:
        sup.close()

    configure(tmp_path, url, delay=0.1)
    sup = Supervisor(tmp_path)
    try:
        submit(tmp_path, "r3", "--wait", "--wait-timeout", "30")
        assert sup.stop(signal.SIGTERM) == 0
    finally:
        sup.close()

    # The ledger is on the server, and nowhere else.
    assert not (tmp_path / "state" / "herdsman.db").exists()
    store = PostgresStore(postgres_url)
    try:
        first = store.get("first")
        assert first is not None
        assert (first.status, first.result) == (
            RunStatus.SUCCEEDED,
            "demo reply: prompt of first\n",
        )
        r0 = store.get("r0")
        assert r0 is not None
        assert (r0.status, r0.reason, r0.attempts) == (RunStatus.LOST, LOST_ON_RESTART, 1)
        rest = [store.get(f"r{n}") for n in (1, 2, 3)]
        assert all(r is not None and r.status is RunStatus.SUCCEEDED for r in rest)
        starts = [r.started_at for r in rest if r is not None and r.started_at is not None]
        assert starts == sorted(starts)
        assert len(set(starts)) == 3
    finally:
        store.close()


def test_an_unreachable_server_is_a_one_line_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", "do-not-print-me")
    # A port nothing listens on: bound, never listening.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        configure(tmp_path, f"postgresql://herdsman@127.0.0.1:{port}/herdsman", delay=0.1)
        result = herdsman("run", *CLI, cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert f"cannot connect to the run ledger on PostgreSQL server 127.0.0.1 port {port}" in last
    assert "do-not-print-me" not in result.stderr


def test_a_second_supervisor_on_the_same_ledger_is_refused(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, password = split_password(postgres_url)
    if password is not None:
        monkeypatch.setenv("PGPASSWORD", password)
    one, two = tmp_path / "one", tmp_path / "two"
    for directory in (one, two):  # two state directories: the lock file cannot tell
        directory.mkdir()
        configure(directory, url, delay=0.1)
    sup = Supervisor(one)
    try:
        second = herdsman("run", *CLI, cwd=two)
        assert second.returncode == 1
        assert "Traceback" not in second.stderr
        assert "another herdsman supervisor is using the run ledger" in second.stderr
        assert submit(one, "still-fine", "--wait") == "demo reply: prompt of still-fine\n\n"
        assert sup.stop(signal.SIGTERM) == 0
    finally:
        sup.close()
