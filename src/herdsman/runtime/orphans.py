"""Agents that outlived a supervisor killed without cleanup (``kill -9``, a crash).

Their runs are recorded as lost at the next start, never re-run; but their
processes live on in their own process groups, and one still working in a
conversation's worktree would overlap the conversation's next run. So the
next start finds them — by the ``HERDSMAN_RUN_ID`` and ``HERDSMAN_STATE_DIR``
every agent inherits, which survive pid reuse and tell apart supervisors on
other state directories — and stops their process groups. A fleet member
waits for the ledger to end their runs first (orphan_watch.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Collection
from pathlib import Path

import trio

from herdsman.runtime.agent_scan import agents_under
from herdsman.runtime.runner.group import group_signalable

log = logging.getLogger("herdsman.orphans")

__all__ = ["agents_under", "find_orphans", "stop_groups", "stop_orphans", "stopped_note"]


def find_orphans(run_ids: Collection[str], state_dir: Path) -> dict[str, set[int]]:
    """Process groups of processes started for ``run_ids`` under ``state_dir``."""
    wanted = set(run_ids)
    return {
        run_id: groups for run_id, groups in agents_under(state_dir).items() if run_id in wanted
    }


async def stop_orphans(
    run_ids: Collection[str], state_dir: Path, grace: float
) -> dict[str, set[int]]:
    """Find the agents of ``run_ids`` still running under ``state_dir`` and stop them.

    Returns the process groups stopped, by run id (nothing when none was left).
    """
    orphans = await trio.to_thread.run_sync(find_orphans, run_ids, state_dir)
    if not orphans:
        return orphans
    groups = {group for found in orphans.values() for group in found}
    log.warning(
        "stopping %d agent process group(s) of lost runs that were still running: %s",
        len(groups),
        ", ".join(sorted(orphans)),
    )
    await stop_groups(groups, grace)
    return orphans


def stopped_note(groups: Collection[int]) -> str:
    """The note a run gets when its agent outlived the supervisor and was stopped."""
    return (
        "its agent was still running when the supervisor restarted"
        f" (process group {', '.join(map(str, sorted(groups)))}) and was stopped"
    )


async def stop_groups(groups: Collection[int], grace: float) -> None:
    """SIGTERM each process group, then SIGKILL whatever is left after ``grace``."""
    alive = set(groups)
    for group in sorted(alive):
        _signal(group, signal.SIGTERM)
    with trio.move_on_after(grace):
        while alive:
            alive = {group for group in alive if group_signalable(group)}
            await trio.sleep(0.05)
    for group in sorted(alive):
        _signal(group, signal.SIGKILL)


def _signal(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)
