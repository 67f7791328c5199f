"""The edit-and-reload journey as a user walks it, end to end, with the real CLI.

Copy the shipped example, start ``herdsman run``, raise a concurrency, add a
repo by command (the next conversation gets a worktree of it), save a typo
(refused; the old configuration stays; ``status`` shows where), fix it. Once
with ``config set``'s own reload request, once through SIGHUP, once through
the file watcher (an editor's save: a temporary file renamed over the file).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_support import CLI, Supervisor, herdsman
from supervisor_support import free_port, git_repository

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "supervisor.toml.example"


def ok(*args: str, cwd: Path) -> str:
    result = herdsman(*args, cwd=cwd)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def editor_save(path: Path, text: str) -> None:
    """Save as editors do: write a temporary file beside it, rename it over."""
    temporary = path.with_name(f".{path.name}.swp")
    temporary.write_text(text)
    os.replace(temporary, path)


def status(cwd: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(ok("status", *CLI, "--json", cwd=cwd))
    return result


def prepared(directory: Path) -> Path:
    """The example, copied and pointed at this test's folder, port and a quick demo agent."""
    path = directory / "supervisor.toml"
    shutil.copyfile(EXAMPLE, path)
    ok("config", "set", *CLI, "supervisor.state_dir", "state", cwd=directory)
    ok("config", "set", *CLI, "api.listen", f"127.0.0.1:{free_port()}", cwd=directory)
    demo = '["herdsman-demo-agent", "--delay", "0.1"]'
    ok("config", "set", *CLI, "providers.demo.exec", demo, cwd=directory)
    repos = herdsman("config", "get", *CLI, "repos", "--json", cwd=directory)
    if json.loads(repos.stdout)["value"]:
        ok("config", "remove", *CLI, "repos", cwd=directory)  # no worktrees of this folder
    return path


class Journey:
    """A supervisor on the copied example, and edits reloaded one way (``trigger``)."""

    def __init__(self, directory: Path, trigger: str) -> None:
        self.directory = directory
        self.trigger = trigger
        self.path = prepared(directory)
        self.supervisor = Supervisor(directory)

    def edit(self, action: str, *args: str) -> None:
        """One ``herdsman config`` edit, reloaded the way this journey reloads."""
        if self.trigger == "command":  # config asks the supervisor itself
            ok("config", action, *CLI, *args, cwd=self.directory)
            return
        ok("config", action, *CLI, "--no-reload", *args, cwd=self.directory)
        if self.trigger == "SIGHUP":
            self.supervisor.process.send_signal(signal.SIGHUP)

    def save(self, text: str) -> None:
        """A hand edit in an editor, reloaded the way this journey reloads."""
        editor_save(self.path, text)
        if self.trigger == "command":
            herdsman("reload", *CLI, cwd=self.directory)
        elif self.trigger == "SIGHUP":
            self.supervisor.process.send_signal(signal.SIGHUP)

    def status(self) -> dict[str, Any]:
        return status(self.directory)

    def wait_for(self, done: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first status for which ``done`` holds, within 30 seconds."""
        deadline = time.monotonic() + 30
        while True:
            now = self.status()
            if done(now):
                return now
            assert time.monotonic() < deadline, f"{what}: {now}\n{self.supervisor.output()}"
            time.sleep(0.1)


@pytest.mark.parametrize("trigger", ["command", "SIGHUP", "watcher"])
def test_edit_reload_journey(tmp_path: Path, trigger: str) -> None:
    example_before = EXAMPLE.read_bytes()
    journey = Journey(tmp_path, trigger)
    try:
        # A concurrency, applied live and shown by `status`.
        start = journey.status()["generation"]
        journey.edit("set", "providers.demo.concurrency", "3")
        journey.wait_for(lambda s: s["limits"]["providers"]["demo"] == 3, "cap 3")
        rows = [line.split() for line in ok("status", *CLI, cwd=tmp_path).splitlines()]
        assert ["demo", "3", "0", "0"] in rows

        # A repo added by command: the next conversation gets a worktree of it.
        app = git_repository(tmp_path / "app")
        before = journey.status()["generation"]
        assert before > start
        journey.edit("add", "repos", "name=app", f"path={app}")
        journey.wait_for(lambda s: s["generation"] > before, "the repo applied")
        ok("submit", *CLI, "-p", "demo", "--conversation", "chat-1", "--wait", "hi", cwd=tmp_path)
        (row,) = json.loads(ok("worktrees", *CLI, "--json", cwd=tmp_path))["worktrees"]
        assert (row["conversation"], row["repo"]) == ("chat-1", "app")
        assert (Path(row["path"]) / "README.md").read_text() == "hello\n"

        # A typo: refused, the old configuration stays, `status` says where.
        generation = journey.status()["generation"]
        where = ok("config", "get", *CLI, "providers.demo.concurrency", "--json", cwd=tmp_path)
        (origin,) = json.loads(where)["origins"].values()
        line = int(origin.rpartition(":")[2])
        lines = journey.path.read_text().splitlines(keepends=True)
        good = lines[line - 1]
        assert good.startswith("concurrency = 3")
        lines[line - 1] = "concurency = 4\n"
        journey.save("".join(lines))
        refused = journey.wait_for(
            lambda s: s["last_reload"] is not None and not s["last_reload"]["ok"], "refused"
        )
        assert (refused["generation"], refused["limits"]["providers"]["demo"]) == (generation, 3)
        error = (
            f"supervisor.toml:{line}:1: providers.demo.concurency: unknown key;"
            " did you mean 'concurrency'?"
        )
        assert error in ok("status", *CLI, cwd=tmp_path).splitlines()[-1]

        # Fixed: applied.
        lines[line - 1] = "concurrency = 4\n"
        journey.save("".join(lines))
        fixed = journey.wait_for(lambda s: s["limits"]["providers"]["demo"] == 4, "fix applied")
        assert fixed["last_reload"]["ok"]
        assert fixed["generation"] > generation
        assert journey.supervisor.stop(signal.SIGTERM) == 0
    finally:
        journey.supervisor.close()
    # The trigger under test was the one that reloaded (the watcher may also have).
    named = {"command": "(API)", "SIGHUP": "(SIGHUP)", "watcher": "(file changed)"}[trigger]
    assert f"reload {named}" in journey.supervisor.output()
    # Nothing in the journey touched the tracked example.
    assert EXAMPLE.read_bytes() == example_before
