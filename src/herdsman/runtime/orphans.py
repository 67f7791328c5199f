"""Agents that outlived a supervisor killed without cleanup (``kill -9``, a crash).

Their runs are recorded as lost at the next start, never re-run; but their
processes live on in their own process groups, and one still working in a
conversation's worktree would overlap the conversation's next run. So the
next start finds them — by the ``HERDSMAN_RUN_ID`` and ``HERDSMAN_STATE_DIR``
every agent inherits, which survive pid reuse and tell apart supervisors on
other state directories — and stops their process groups.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Collection
from pathlib import Path

import trio

log = logging.getLogger("herdsman.orphans")

__all__ = ["find_orphans", "stop_groups"]


def find_orphans(run_ids: Collection[str], state_dir: Path) -> dict[str, set[int]]:
    """Process groups of processes started for ``run_ids`` under ``state_dir``.

    Reads ``/proc/<pid>/environ``; where there is no ``/proc`` (not Linux)
    nothing is found. Processes of other users cannot be read and are skipped.
    """
    wanted = {f"HERDSMAN_RUN_ID={run_id}".encode(): run_id for run_id in run_ids}
    marker = f"HERDSMAN_STATE_DIR={state_dir}".encode()
    found: dict[str, set[int]] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if marker not in environ:
                continue
            run_id = next((wanted[entry] for entry in environ if entry in wanted), None)
            if run_id is not None:
                found.setdefault(run_id, set()).add(os.getpgid(pid))
        except (OSError, ProcessLookupError):  # gone meanwhile, or not ours to read
            continue
    return found


async def stop_groups(groups: Collection[int], grace: float) -> None:
    """SIGTERM each process group, then SIGKILL whatever is left after ``grace``."""
    alive = set(groups)
    for group in sorted(alive):
        _signal(group, signal.SIGTERM)
    with trio.move_on_after(grace):
        while alive:
            alive = {group for group in alive if _exists(group)}
            await trio.sleep(0.05)
    for group in sorted(alive):
        _signal(group, signal.SIGKILL)


def _signal(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _exists(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
