"""`herdsman run` as a real process: the CLI clients, signals, crashes and restarts."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import CLI, Supervisor, herdsman, process_alive, processes_with_env
from supervisor_support import write_config

from herdsman.runtime.store import NewRun, RunStatus, SqliteStore


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def started(directory: Path) -> Supervisor:
    return Supervisor(directory)


@pytest.mark.slow
def test_submit_wait_status_and_a_clean_stop(workdir: Path) -> None:
    write_config(workdir, delay=0.2)
    sup = started(workdir)
    try:
        assert f"; ledger: {workdir / 'state' / 'herdsman.db'}" in sup.output()
        result = herdsman(
            "submit",
            *CLI,
            "-p",
            "demo",
            "--wait",
            cwd=workdir,
            stdin="what is 6 x 7?\n",
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout == "demo reply: what is 6 x 7?\n\n"
        later = herdsman(
            "submit",
            *CLI,
            "-p",
            "demo",
            "--id",
            "later",
            "follow me",
            cwd=workdir,
        )
        assert later.stdout.strip() == "later"
        followed = herdsman("logs", "-c", "supervisor.toml", "--follow", "later", cwd=workdir)
        assert followed.returncode == 0, followed.stderr
        assert followed.stdout == "demo reply: follow me\n"
        status = herdsman("status", "-c", "supervisor.toml", cwd=workdir)
        assert status.returncode == 0, status.stderr
        assert "demo" in status.stdout
        assert sup.stop(signal.SIGTERM) == 0
        assert "stopped cleanly" in sup.output()
    finally:
        sup.close()


def test_clients_say_when_no_supervisor_answers(workdir: Path) -> None:
    write_config(workdir)
    result = herdsman("status", "-c", "supervisor.toml", cwd=workdir)
    assert result.returncode == 1
    assert "no supervisor has run with this state_dir yet" in result.stderr
    assert "herdsman run" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_second_supervisor_on_the_same_state_dir_is_refused(workdir: Path) -> None:
    write_config(workdir)
    sup = started(workdir)
    try:
        second = herdsman("run", "-c", "supervisor.toml", cwd=workdir)
        assert second.returncode == 1
        assert f"another herdsman supervisor (pid {sup.process.pid})" in second.stderr
        assert "Traceback" not in second.stderr
    finally:
        sup.close()


def test_kill_9_mid_run_the_run_is_lost_not_rerun_and_queued_runs_keep_order(
    workdir: Path,
) -> None:
    write_config(workdir, concurrency=1, delay=30)
    sup = started(workdir)
    try:
        ids = []
        for n in range(4):
            result = herdsman(
                "submit",
                *CLI,
                "-p",
                "demo",
                "--id",
                f"r{n}",
                "--conversation",
                f"c{n}",
                f"prompt {n}",
                cwd=workdir,
            )
            assert result.returncode == 0, result.stderr
            ids.append(result.stdout.strip())
        assert ids == ["r0", "r1", "r2", "r3"]
        state = workdir / "state"
        deadline = time.monotonic() + 20
        while not (state / "logs" / "r0.log").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sup.kill_with_its_keeper()
    finally:
        sup.close()
    # A supervisor killed this way cannot stop its runs: r0's agent lives on
    # in its own process group, until the next start stops it.
    orphans = processes_with_env("HERDSMAN_RUN_ID=r0", workdir)
    assert orphans, "the agent of r0 should have outlived its supervisor"

    # Restart with quick runs; r0 must be lost, never re-run, and its agent stopped.
    write_config(workdir, concurrency=1, delay=0.1)
    sup = started(workdir)
    try:
        deadline = time.monotonic() + 10
        while any(process_alive(pid) for pid in orphans):
            assert time.monotonic() < deadline, "the orphaned agent of r0 was not stopped"
            time.sleep(0.05)
        assert "stopping 1 agent process group(s) of lost runs" in sup.output()
        result = herdsman(
            "submit",
            *CLI,
            "-p",
            "demo",
            "--id",
            "r3",
            "x",
            "--wait",
            "--wait-timeout",
            "30",
            cwd=workdir,
        )
        assert result.returncode == 0, result.stderr
        assert sup.stop(signal.SIGTERM) == 0
    finally:
        sup.close()
    store = SqliteStore(workdir / "state" / "herdsman.db")
    try:
        r0 = store.get("r0")
        assert r0 is not None
        assert r0.status is RunStatus.LOST
        assert r0.reason == "supervisor restarted before this run finished"
        assert r0.attempts == 1
        assert r0.notes == (
            "its agent was still running when the supervisor restarted"
            f" (process group {orphans[0]}) and was stopped",
        )
        rest = [store.get(f"r{n}") for n in (1, 2, 3)]
        assert all(r is not None and r.status is RunStatus.SUCCEEDED for r in rest)
        starts = [r.started_at for r in rest if r is not None and r.started_at is not None]
        assert len(starts) == len(rest)
        assert starts == sorted(starts)
    finally:
        store.close()


def test_second_signal_cancels_running_runs_and_the_exit_code_says_so(workdir: Path) -> None:
    write_config(workdir, delay=60)
    sup = started(workdir)
    try:
        herdsman("submit", "-c", "supervisor.toml", "-p", "demo", "--id", "long", "x", cwd=workdir)
        deadline = time.monotonic() + 20
        while not (workdir / "state" / "logs" / "long.log").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sup.process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert sup.process.poll() is None  # draining, waiting for the run
        assert sup.stop(signal.SIGINT) == 3
        assert "cancelling 1 running run" in sup.output()
    finally:
        sup.close()
    store = SqliteStore(workdir / "state" / "herdsman.db")
    try:
        long = store.get("long")
        assert long is not None
        assert long.status is RunStatus.CANCELLED
    finally:
        store.close()
    assert os.path.exists(workdir / "state" / "supervisor.lock")


def test_runs_logs_and_cancel_from_the_command_line(workdir: Path) -> None:
    # "busy" must still run when the test cancels it, after a dozen CLI calls
    # that take seconds each on a loaded machine: it never ends by itself.
    write_config(workdir, concurrency=1, delay=3600)
    sup = started(workdir)
    try:
        herdsman("submit", *CLI, "-p", "demo", "--id", "busy", "long one", cwd=workdir)
        herdsman(
            "submit",
            *CLI,
            "-p",
            "demo",
            "--id",
            "waiting",
            "--conversation",
            "c",
            "next",
            cwd=workdir,
        )
        listed = herdsman("runs", *CLI, cwd=workdir)
        assert listed.returncode == 0, listed.stderr
        rows = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
        assert rows["waiting"] == "queued"
        # A queued run has no log yet: said so, and how to wait for it.
        queued = herdsman("logs", *CLI, "waiting", cwd=workdir)
        assert (queued.returncode, queued.stdout) == (1, "")
        assert queued.stderr.endswith(
            ": run waiting is queued; `herdsman logs waiting --follow` waits for it to start"
            " and follows it\n"
        )
        cancelled = herdsman("cancel", *CLI, "waiting", cwd=workdir)
        assert cancelled.stdout.strip() == "waiting: cancelled"
        again = herdsman("cancel", *CLI, "waiting", cwd=workdir)
        assert again.returncode == 1
        assert "already ended as cancelled (HTTP 409)" in again.stderr
        # Ended without a log here: following it says so rather than print nothing.
        unlogged = herdsman("logs", *CLI, "--follow", "waiting", cwd=workdir)
        assert unlogged.returncode == 1
        assert "no log at" in unlogged.stderr
        assert "run waiting ended as cancelled without a log on this machine" in unlogged.stderr
        unfollowed = herdsman("logs", *CLI, "waiting", cwd=workdir)
        assert (unfollowed.returncode, unfollowed.stderr) == (1, unlogged.stderr)
        deadline = time.monotonic() + 20
        while "running" not in herdsman("runs", *CLI, "busy", cwd=workdir).stdout:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        stopped = herdsman("cancel", *CLI, "busy", cwd=workdir)
        assert stopped.stdout.strip() == "busy: cancelled", stopped.stderr
        logs = herdsman("logs", *CLI, "busy", cwd=workdir)
        assert logs.returncode == 0
        missing = herdsman("logs", *CLI, "nope", cwd=workdir)
        assert missing.returncode == 1
        assert "no log at" in missing.stderr
        assert "no run with this id has started on this supervisor" in missing.stderr
        hostile = herdsman("logs", *CLI, "../../etc/passwd", cwd=workdir)
        assert hostile.returncode == 2  # a usage error
        assert "run id must start with a letter or digit" in hostile.stderr
        shown = herdsman("runs", *CLI, "busy", "--json", cwd=workdir)
        assert '"status": "cancelled"' in shown.stdout
    finally:
        sup.close()


def test_a_taken_api_address_is_a_one_line_error_and_starts_nothing(workdir: Path) -> None:
    write_config(workdir)
    state = workdir / "state"
    state.mkdir()
    ledger = SqliteStore(state / "herdsman.db")
    ledger.submit(NewRun(id="q1", provider="demo", prompt="x"), 1.0)
    ledger.close()
    listen = next(
        line
        for line in (workdir / "supervisor.toml").read_text().splitlines()
        if line.startswith("listen")
    )
    port = int(listen.rpartition(":")[2].rstrip('"'))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        result = herdsman("run", *CLI, cwd=workdir)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"herdsman: cannot listen on 127.0.0.1:{port}: the address is in use "
        "(another supervisor or program?); choose another with api.listen"
    )
    ledger = SqliteStore(state / "herdsman.db")
    try:
        queued = ledger.get("q1")
        assert queued is not None
        assert (queued.status, queued.attempts) == (RunStatus.QUEUED, 0)  # never started
    finally:
        ledger.close()


def test_a_broken_ledger_file_is_a_one_line_error(workdir: Path) -> None:
    write_config(workdir)
    (workdir / "state").mkdir()
    (workdir / "state" / "herdsman.db").write_bytes(b"this is not a database" * 100)
    result = herdsman("run", *CLI, cwd=workdir)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "cannot open the run ledger" in result.stderr.strip().splitlines()[-1]


def test_a_prompt_that_is_not_utf8_is_refused_in_one_line(workdir: Path) -> None:
    write_config(workdir)
    (workdir / "state").mkdir()
    (workdir / "state" / "api-token").write_text("token\n")
    result = subprocess.run(
        [sys.executable, "-m", "herdsman", "submit", *CLI, "-p", "demo"],
        cwd=workdir,
        input=b"abc\xff",
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.decode().startswith("herdsman: the prompt on stdin is not UTF-8 text")


def test_worktrees_are_listed_and_swept_from_the_command_line(workdir: Path) -> None:
    repo = workdir / "app"
    repo.mkdir()
    (repo / "README.md").write_text("hello\n")
    for args in (
        ["init", "-q", "-b", "main"],
        ["add", "-A"],
        [
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t.invalid",
            "-c",
            "commit.gpgsign=false",
            "commit",
            "-qm",
            "initial",
        ],
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    extra = f'[[repos]]\nname = "app"\npath = "{repo}"\n\n[retention]\nidle = "1s"\n'
    write_config(workdir, delay=0.1, extra=extra)
    sup = started(workdir)
    try:
        done = herdsman(
            "submit", *CLI, "-p", "demo", "--conversation", "chat-1", "--wait", "hi", cwd=workdir
        )
        assert done.returncode == 0, done.stderr
        listed = herdsman("worktrees", *CLI, "--json", cwd=workdir)
        (row,) = json.loads(listed.stdout)["worktrees"]
        assert (row["conversation"], row["repo"], row["status"]) == ("chat-1", "app", "clean")
        checkout = Path(row["path"])
        (checkout / "README.md").write_text("work in progress\n")
        time.sleep(1.2)  # past retention.idle
        dry = herdsman("worktrees", *CLI, "sweep", "--dry-run", cwd=workdir)
        assert dry.stdout.split()[:2] == ["kept-dirty", str(checkout)], dry.stdout
        (checkout / "README.md").write_text("hello\n")
        dry = herdsman("worktrees", *CLI, "sweep", "--dry-run", cwd=workdir)
        assert dry.stdout.split()[:2] == ["would", "remove"], dry.stdout
        assert checkout.exists()
        swept = herdsman("worktrees", *CLI, "sweep", cwd=workdir)
        assert swept.stdout.split()[:2] == ["removed", str(checkout)], swept.stdout
        assert not checkout.exists()
        after = herdsman("worktrees", *CLI, cwd=workdir)
        assert after.stdout.splitlines()[1:] == []
    finally:
        sup.close()


def assert_sighup_reloaded(sup: Supervisor, trigger: str, deadline: float) -> None:
    """SIGHUP reloaded the file; the file watcher may have applied the edit a moment
    before (a loaded machine), and then SIGHUP's reload says so."""
    applied = "reload (SIGHUP): providers.demo.concurrency: 1 -> 2 (applied)"
    repeated = "reload (SIGHUP): the file is as the last reload (file changed) found it"
    while applied not in sup.output() and repeated not in sup.output():
        assert time.monotonic() < deadline, sup.output()
        time.sleep(0.1)
    assert trigger == ("SIGHUP" if applied in sup.output() else "file changed")


def test_sighup_reload_and_config_set_reload_a_running_supervisor(workdir: Path) -> None:
    path = write_config(workdir, concurrency=1)
    sup = started(workdir)
    try:
        path.write_text(path.read_text().replace("concurrency = 1", "concurrency = 2"))
        sup.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while True:
            status = json.loads(herdsman("status", *CLI, "--json", cwd=workdir).stdout)
            if status["generation"] == 2:
                break
            assert time.monotonic() < deadline, sup.output()
            time.sleep(0.1)
        assert status["limits"]["providers"] == {"demo": 2}
        assert_sighup_reloaded(sup, status["last_reload"]["trigger"], deadline)

        edited = herdsman("config", "set", *CLI, "providers.demo.concurrency", "3", cwd=workdir)
        assert edited.returncode == 0, edited.stderr
        # The file watcher may have applied the edit a moment before the
        # reload `config set` asks for; either way it is in force.
        lines = edited.stdout.splitlines()
        assert lines[:2] == [
            "providers.demo.concurrency = 3  (supervisor.toml)",
            "the running supervisor reloaded the file:",
        ]
        if lines[2].startswith("the file is unchanged since it was reloaded (file changed, "):
            del lines[2]  # the watcher applied it a moment before; this is that reload
        assert lines[2:] == ["  providers.demo.concurrency: 2 -> 3  (applied)", "generation 3"]
        status = json.loads(herdsman("status", *CLI, "--json", cwd=workdir).stdout)
        assert status["limits"]["providers"] == {"demo": 3}
        # Reloading the same file again changes nothing, and says so rather
        # than print the earlier reload's changes as if made now.
        again = herdsman("reload", *CLI, cwd=workdir)
        assert (again.returncode, again.stderr) == (0, ""), again.stdout
        assert re.fullmatch(
            r"supervisor\.toml is unchanged since the reload at \d\d:\d\d:\d\d"
            r" \(applied, generation 3\); nothing new to apply,"
            r" but any account that needed a login takes runs again\n",
            again.stdout,
        ), again.stdout
        again_json = json.loads(herdsman("reload", *CLI, "--json", cwd=workdir).stdout)
        assert again_json["repeat"] is True
        assert again_json["at"] == status["last_reload"]["at"]
        assert status["last_reload"]["repeat"] is False

        path.write_text(path.read_text().replace("concurrency = 3", "concurrency = 0"))
        rejected = herdsman("reload", *CLI, cwd=workdir)
        assert rejected.returncode == 1
        # One report, all of it on stderr (the watcher may have rejected the
        # file a moment before; the answer is then that reload, and says so).
        assert rejected.stdout == ""
        rejected_lines = rejected.stderr.splitlines()
        assert re.fullmatch(
            r"reload rejected; nothing changed \(generation 3 stays in force\):"
            r"|supervisor\.toml is unchanged since the reload at \d\d:\d\d:\d\d, which was"
            r" rejected \(generation 3 stays in force\):",
            rejected_lines[0],
        ), rejected_lines[0]
        assert rejected_lines[1:] == [
            "  supervisor.toml:8:15: providers.demo.concurrency: must be a whole number"
            " from 1 to 64, got 0",
        ]
        rejected_again = herdsman("reload", *CLI, cwd=workdir)
        assert (rejected_again.returncode, rejected_again.stdout) == (1, "")
        assert re.fullmatch(
            r"supervisor\.toml is unchanged since the reload at \d\d:\d\d:\d\d, which was"
            r" rejected \(generation 3 stays in force\):\n  supervisor\.toml:8:15: .*\n",
            rejected_again.stderr,
        ), rejected_again.stderr
        path.write_text(path.read_text().replace("concurrency = 0", "concurrency = 3"))
        unchanged = herdsman("reload", *CLI, cwd=workdir)
        assert unchanged.returncode == 0
        # The watcher may have reloaded the repaired file a moment before.
        assert re.fullmatch(
            r"no changes: the file is already in force \(generation 3\)\n"
            r"|supervisor\.toml is unchanged since the reload at \d\d:\d\d:\d\d"
            r" \(no changes, generation 3\); nothing new to apply,"
            r" but any account that needed a login takes runs again\n",
            unchanged.stdout,
        ), unchanged.stdout
        assert sup.stop(signal.SIGTERM) == 0
    finally:
        sup.close()


def test_the_cli_finds_a_supervisor_whose_file_now_names_another_address(
    workdir: Path,
) -> None:
    path = write_config(workdir)
    sup = started(workdir)
    try:
        text = path.read_text()
        listen = next(line for line in text.splitlines() if line.startswith("listen"))
        path.write_text(text.replace(listen, 'listen = "127.0.0.1:1"'))
        reloaded = herdsman("reload", *CLI, cwd=workdir)
        assert reloaded.returncode == 0, reloaded.stderr
        # (The file watcher may have reloaded it a moment before: then the
        # answer is one line that says so, naming what waits.)
        assert re.search(
            r"api\.listen: .* \(needs a restart; the running value is kept\)"
            r"|unchanged since the reload at .* \(api\.listen waits for a restart,",
            reloaded.stdout,
        ), reloaded.stdout
        status = herdsman("status", *CLI, cwd=workdir)
        assert status.returncode == 0, status.stderr
        assert "demo" in status.stdout
        assert "waiting for a restart" in status.stdout
        assert '    api.listen: "127.0.0.1:' in status.stdout
        assert sup.stop(signal.SIGTERM) == 0
    finally:
        sup.close()
    # Stopped: its pointer is gone, and the file's own address is used again.
    gone = herdsman("status", *CLI, cwd=workdir)
    assert gone.returncode == 1
    assert "127.0.0.1:1" in gone.stderr
