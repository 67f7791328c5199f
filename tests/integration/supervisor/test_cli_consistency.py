"""The command line against a real supervisor: --json everywhere, flags honoured or refused.

One ``herdsman run`` serves the module (each test uses its own run ids and
conversations); every command runs as a real process, piped like a script
would run it, or on a pseudo-terminal 80 columns wide like a person would.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import CLI, Supervisor, herdsman
from supervisor_support import git_repository, write_config

from herdsman.cli_tables import duration_text, local_time

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("cli")
    repo = git_repository(directory / "app")
    agent = f'["{sys.executable}", "-m", "herdsman.demo_agent"'
    providers = (
        f'\n[providers.slow]\nexec = {agent}, "--delay", "60"]\nconcurrency = 1\n'
        f'\n[providers.broken]\nexec = {agent}, "--delay", "0", "--fail"]\n'
    )
    extra = f'\n[[repos]]\nname = "app"\npath = "{repo}"\n'
    write_config(directory, delay=0.1, extra_provider=providers, extra=extra)
    supervisor = Supervisor(directory)
    try:
        yield directory
    finally:
        supervisor.close()


def run_json(workdir: Path, run_id: str) -> dict[str, Any]:
    shown = herdsman("runs", *CLI, run_id, "--json", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    run: dict[str, Any] = json.loads(shown.stdout)
    return run


def usage_error(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The one line a usage error says, after checking it is one (exit 2, nothing on stdout)."""
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"herdsman {command}: ")
    assert "Traceback" not in result.stderr
    return result.stderr


def on_terminal(*args: str, cwd: Path, columns: int = 80) -> tuple[int, str]:
    """Run ``herdsman ARGS`` on a pseudo-terminal ``columns`` wide; its exit status and text."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "herdsman", *args],
        cwd=cwd,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    return code, ANSI.sub("", text)


def test_submit_json_without_wait_prints_the_run_submitted(workdir: Path) -> None:
    done = herdsman("submit", *CLI, "-p", "demo", "--id", "j1", "--json", "hi", cwd=workdir)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert (run["id"], run["provider"], run["prompt"]) == ("j1", "demo", "hi")
    assert run["status"] in ("queued", "running")
    assert isinstance(run["submitted_at"], float)
    assert run.keys() == run_json(workdir, "j1").keys()
    # Without --json, the bare id a script captures, as before.
    plain = herdsman("submit", *CLI, "-p", "demo", "--id", "j2", "hi", cwd=workdir)
    assert plain.stdout == "j2\n"


def test_wait_timeout_without_wait_is_refused(workdir: Path) -> None:
    refused = herdsman(
        "submit", *CLI, "-p", "demo", "--id", "never", "--wait-timeout", "5", "x", cwd=workdir
    )
    assert "--wait-timeout goes with --wait" in usage_error(refused, "submit")
    missing = herdsman("runs", *CLI, "never", cwd=workdir)
    assert missing.returncode == 1  # nothing was submitted


def test_a_prompt_neither_given_nor_piped_is_a_usage_error(workdir: Path) -> None:
    code, text = on_terminal("submit", *CLI, "-p", "demo", cwd=workdir)
    assert code == 2
    assert text == "herdsman submit: give the prompt as an argument or on stdin\n"


def test_runs_shows_submitted_time_duration_and_the_reason(workdir: Path) -> None:
    failed = herdsman("submit", *CLI, "-p", "broken", "--id", "b1", "--wait", "x", cwd=workdir)
    assert failed.returncode == 1
    ok = herdsman("submit", *CLI, "-p", "demo", "--id", "d1", "--wait", "y", cwd=workdir)
    assert ok.returncode == 0, ok.stderr
    listed = herdsman("runs", *CLI, cwd=workdir)
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    columns = ["id", "status", "provider", "conversation", "submitted", "took", "reason"]
    assert header.split() == columns
    every = json.loads(herdsman("runs", *CLI, "--json", cwd=workdir).stdout)["runs"]
    assert len(lines) == len(every)  # one line a run, whatever its reason holds
    rows = {line.split()[0]: line for line in lines}
    for run_id in ("b1", "d1"):
        run = run_json(workdir, run_id)
        fields = rows[run_id].split(maxsplit=7)
        assert fields[:4] == [run_id, run["status"], run["provider"], "-"]
        assert " ".join(fields[4:6]) == local_time(run["submitted_at"])
        assert fields[6] == duration_text(run["finished_at"] - run["started_at"])
        reason = run["reason"] or ""
        assert fields[7] == (reason.splitlines()[0] if reason else "-")
    assert run_json(workdir, "b1")["reason"]  # the failed run's reason is shown, not "-"


def test_runs_refuses_list_filters_with_a_run_id(workdir: Path) -> None:
    refused = herdsman("runs", *CLI, "d1", "--status", "failed", "--limit", "3", cwd=workdir)
    said = usage_error(refused, "runs")
    assert "--status, --limit filter the list of runs" in said


def test_cancel_json_prints_the_run_as_the_cancel_left_it(workdir: Path) -> None:
    herdsman("submit", *CLI, "-p", "slow", "--id", "s1", "first", cwd=workdir)
    herdsman("submit", *CLI, "-p", "slow", "--id", "s2", "behind it", cwd=workdir)
    queued = herdsman("cancel", *CLI, "s2", "--json", cwd=workdir)
    assert queued.returncode == 0, queued.stderr
    run = json.loads(queued.stdout)
    assert (run["id"], run["status"]) == ("s2", "cancelled")
    assert run.keys() == run_json(workdir, "s2").keys()
    deadline = time.monotonic() + 20
    while run_json(workdir, "s1")["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    stopped = herdsman("cancel", *CLI, "--json", "s1", cwd=workdir)
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["status"] == "cancelled"
    assert herdsman("cancel", *CLI, "s2", "--json", cwd=workdir).returncode == 1


def test_accounts_usage_errors_and_end_rest_json(workdir: Path) -> None:
    bare = herdsman("accounts", *CLI, "end-rest", cwd=workdir)
    assert "accounts end-rest needs PROVIDER and ACCOUNT" in usage_error(bare, "accounts")
    named = herdsman("accounts", *CLI, "demo", cwd=workdir)
    assert "invalid choice: 'demo'" in usage_error(named, "accounts")
    ended = herdsman("accounts", *CLI, "end-rest", "demo", "--json", cwd=workdir)
    assert ended.returncode == 0, ended.stderr
    row = json.loads(ended.stdout)
    assert (row["provider"], row["account"], row["available"]) == ("demo", None, True)
    listed = json.loads(herdsman("accounts", *CLI, "--json", cwd=workdir).stdout)
    assert row.keys() == listed["accounts"][0].keys()
    help_page = herdsman("accounts", "--help", cwd=workdir).stdout
    assert "PROVIDER [ACCOUNT]" in help_page
    assert "ambient environment" in help_page


def test_worktrees_flags_are_honoured_or_refused(workdir: Path) -> None:
    done = herdsman(
        "submit", *CLI, "-p", "demo", "--conversation", "wt-1", "--wait", "hi", cwd=workdir
    )
    assert done.returncode == 0, done.stderr
    refused = herdsman("worktrees", *CLI, "sweep", "--set", "retention.idle=1s", cwd=workdir)
    assert "--set is not taken here" in usage_error(refused, "worktrees")
    dry = herdsman("worktrees", *CLI, "--dry-run", cwd=workdir)
    assert "--dry-run goes with sweep" in usage_error(dry, "worktrees")
    (row,) = (
        r
        for r in json.loads(herdsman("worktrees", *CLI, "--json", cwd=workdir).stdout)["worktrees"]
        if r["conversation"] == "wt-1"
    )
    assert Path(row["path"]).exists()  # the refused sweep removed nothing
    listed = herdsman("worktrees", *CLI, cwd=workdir).stdout.splitlines()
    assert listed[0].split() == ["conversation", "repo", "last", "used", "state", "size", "path"]
    (line,) = (line for line in listed if line.startswith("wt-1 "))
    used = local_time(dt.datetime.fromisoformat(row["last_used"]).timestamp())
    assert line.split()[:5] == ["wt-1", "app", *used.split(), "clean"]
    assert line.endswith(f"  {row['path']}")


def test_tables_fit_an_80_column_terminal(workdir: Path) -> None:
    for conversation in ("a conversation with a rather long name", "c-2"):
        herdsman("submit", *CLI, "-p", "broken", "--conversation", conversation, "x", cwd=workdir)
    herdsman("submit", *CLI, "-p", "demo", "--conversation", "wt-2", "--wait", "x", cwd=workdir)
    for command in ("runs", "worktrees", "accounts"):
        piped = herdsman(command, *CLI, cwd=workdir).stdout
        code, shown = on_terminal(command, *CLI, cwd=workdir)
        assert code == 0, shown
        assert all(len(line) <= 80 for line in shown.splitlines()), shown
        if command != "accounts":  # piped, every row stays whole on its line
            assert max(len(line) for line in piped.splitlines()) > 80, piped
    code, shown = on_terminal("runs", *CLI, cwd=workdir)
    # The long conversation is wrapped inside its column, not cut.
    words = shown.split()
    assert {"conversation", "rather", "long", "name"} <= set(words), shown
