"""Helpers for the runner's integration tests (real processes, no mocks)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import trio

from herdsman.runtime.runner import ProcessOutcome, ProcessSpec, RunCancel, execute

# The children are Python processes started with this interpreter, so they can
# import herdsman (installed in editable mode) without any PATH or PYTHONPATH.
PYTHON = sys.executable


def demo(*args: str) -> tuple[str, ...]:
    """argv for the demo agent."""
    return (PYTHON, "-m", "herdsman.demo_agent", *args)


def script(code: str) -> tuple[str, ...]:
    """argv for a small Python program."""
    return (PYTHON, "-c", code)


STREAMS = Path(__file__).resolve().parents[2] / "fixtures" / "agent_streams"
"""The recorded and written agent streams (their README says which is which)."""


def replay(name: str, exit_code: int, *, then_sleep: float = 0) -> tuple[str, ...]:
    """argv of a process that writes the recorded streams and exits as the CLI did."""
    stdout, stderr = STREAMS / f"{name}.stdout", STREAMS / f"{name}.stderr"
    code = (
        "import sys, time, pathlib\n"
        f"sys.stdout.buffer.write(pathlib.Path({str(stdout)!r}).read_bytes())\n"
        "sys.stdout.flush()\n"
        f"err = pathlib.Path({str(stderr)!r})\n"
        "if err.exists(): sys.stderr.buffer.write(err.read_bytes()); sys.stderr.flush()\n"
        f"time.sleep({then_sleep})\n"
        f"sys.exit({exit_code})\n"
    )
    return script(code)


def make_spec(tmp_path: Path, **overrides: Any) -> ProcessSpec:
    """A ProcessSpec with test defaults in ``tmp_path``; keyword arguments override them."""
    fields: dict[str, Any] = {
        "argv": demo("--delay", "0"),
        "env": {"PATH": os.defpath, "LANG": "C.UTF-8"},
        "cwd": tmp_path,
        "prompt": "and more\nsay hello",
        "timeout": 20.0,
        "idle_timeout": None,
        "log_path": tmp_path / "logs" / "run.log",
        "protocol": "plain",
        "kill_grace": 1.0,
    }
    fields.update(overrides)
    return ProcessSpec(**fields)


async def run_into(
    outcomes: list[ProcessOutcome],
    spec: ProcessSpec,
    cancel: RunCancel | None = None,
    *,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """execute() for nursery.start: the pid comes back, the outcome lands in ``outcomes``."""
    outcomes.append(await execute(spec, cancel=cancel, task_status=task_status))


def is_gone(pid: int) -> bool:
    """Whether ``pid`` is no longer running.

    A zombie counts as gone: it has exited, and in this container PID 1 does
    not reap orphans, so an orphaned grandchild stays a zombie forever.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(b")") + 2 :].split()[0] in (b"Z", b"X")


def wait_gone(pid: int, within: float = 3.0) -> bool:
    """Poll until ``pid`` is gone; False if it still runs after ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if is_gone(pid):
            return True
        time.sleep(0.02)
    return is_gone(pid)


def grandchild_pid(log_path: Path) -> int | None:
    """The pid the demo agent reported for its grandchild, if it did yet."""
    try:
        found = re.search(rb"grandchild pid (\d+)", log_path.read_bytes())
    except FileNotFoundError:
        return None
    return int(found.group(1)) if found else None


async def wait_for_grandchild(log_path: Path, within: float = 10.0) -> int:
    """Wait until the demo agent has started its grandchild; its pid."""
    with trio.fail_after(within):
        while (pid := grandchild_pid(log_path)) is None:
            await trio.sleep(0.01)
    return pid
