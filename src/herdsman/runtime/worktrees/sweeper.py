"""Retention: removing the worktrees of idle conversations, never losing work.

A conversation's worktrees are removed once no run has started in it for
``idle`` seconds, with ``git worktree remove`` *without* force: git refuses a
checkout holding modified or untracked files, and such a checkout is kept,
reported as kept-dirty, and tried again at the next sweep. The branch stays
in the source repository.

A conversation with a queued or running run is never swept. The check is
made right before each removal, with the conversation's lock held (the lock
the manager takes to prepare a run's checkouts). A new run of the
conversation counts as busy from the moment it is submitted, and the
supervisor records it only once a removal already under way has finished
(``WorktreeManager.removing``), so no run of the conversation can become
queued while one of its worktrees is being removed; its start then makes the
worktrees again on their branches. A fleet member holds back runs it polls
the same way, and its ``is_busy`` also counts runs anywhere in the fleet.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import attrs

from herdsman.config import Repo
from herdsman.runtime.git import GitError, WorktreeDirty
from herdsman.runtime.state_paths import LinkRefused, refuse_links, remove_folder_below
from herdsman.runtime.worktrees.manager import (
    METADATA,
    ConversationFolder,
    WorktreeManager,
    branch_of,
)

log = logging.getLogger("herdsman.worktrees")

#: ``(workspace, conversation) -> whether it has a queued or running run``.
IsBusy = Callable[[str, str], bool]


@attrs.frozen
class SweptWorktree:
    """What a sweep did, or would do, with one worktree."""

    workspace: str
    conversation: str
    repo: str
    path: Path
    action: str  # "removed", "would remove", "kept-dirty", "busy", "refused", "failed"
    detail: str = ""


@attrs.frozen
class SweepReport:
    """Everything one sweep looked at that was old enough to go."""

    entries: tuple[SweptWorktree, ...]

    def count(self, action: str) -> int:
        """How many entries ended with ``action``."""
        return sum(1 for entry in self.entries if entry.action == action)


async def sweep(
    manager: WorktreeManager,
    *,
    now: float,
    idle: float,
    is_busy: IsBusy,
    dry_run: bool = False,
) -> SweepReport:
    """Remove the clean worktrees of conversations idle for longer than ``idle``."""
    entries: list[SweptWorktree] = []
    for folder in idle_folders(manager, now=now, idle=idle):
        async with manager.lock(folder.workspace, folder.conversation):
            entries.extend(
                await _sweep_folder(
                    manager, folder, now=now, idle=idle, is_busy=is_busy, dry_run=dry_run
                )
            )
    report = SweepReport(tuple(entries))
    if entries:
        log.info(
            "worktree sweep: %d removed, %d kept dirty, %d busy, %d refused, %d failed",
            report.count("removed"),
            report.count("kept-dirty"),
            report.count("busy"),
            report.count("refused"),
            report.count("failed"),
        )
    return report


def idle_folders(manager: WorktreeManager, *, now: float, idle: float) -> list[ConversationFolder]:
    """The conversation folders a sweep at ``now`` looks at: idle for longer than ``idle``."""
    return [folder for folder in manager.folders() if now - folder.last_used > idle]


async def _sweep_folder(
    manager: WorktreeManager,
    folder: ConversationFolder,
    *,
    now: float,
    idle: float,
    is_busy: IsBusy,
    dry_run: bool,
) -> list[SweptWorktree]:
    # Re-read under the lock: a run may have prepared meanwhile. This folder
    # only: all of them for each would make a sweep quadratic.
    fresh = manager.folder_at(folder.path)
    if fresh is None or now - fresh.last_used <= idle:
        return []
    entries = []
    branch = branch_of(folder.path.name)
    for repo in manager.known_repos:
        path = folder.path / repo.name
        if os.path.lexists(path):
            action, detail = await _sweep_worktree(
                manager, folder, repo, path, branch, is_busy=is_busy, dry_run=dry_run
            )
            entries.append(
                SweptWorktree(
                    folder.workspace, folder.conversation, repo.name, path, action, detail
                )
            )
    # No `git worktree prune`: removal already dropped each registration, and
    # pruning would also drop the user's own worktrees that are unmounted now.
    if not dry_run and all(entry.action == "removed" for entry in entries):
        try:
            # Only what we made: anything else in it (or a link) stays.
            remove_folder_below(manager.anchor, folder.path, leaving=METADATA)
        except OSError as exc:
            log.warning("could not remove the folder %s: %s", folder.path, exc)
    return entries


async def _sweep_worktree(
    manager: WorktreeManager,
    folder: ConversationFolder,
    repo: Repo,
    path: Path,
    branch: str,
    *,
    is_busy: IsBusy,
    dry_run: bool,
) -> tuple[str, str]:
    """What became of one worktree of an idle conversation: its action and detail."""
    # Checked right before each removal, with nothing awaited in between.
    if is_busy(folder.workspace, folder.conversation):
        return "busy", ""
    # The check a run makes before reusing a checkout: git would act on
    # whatever a link there points at (an agent may have swapped its
    # checkout for a link to the user's own worktree).
    try:
        await manager.check_owned(repo, path, branch)
    except (GitError, OSError) as exc:
        log.warning("not sweeping %s: %s", path, exc)
        return "refused", str(exc)
    state = await manager.git.worktree_status(path)
    if not state.clean:
        return "kept-dirty", ", ".join((*state.modified, *state.untracked)[:5])
    if dry_run:
        return "would remove", ""
    if is_busy(folder.workspace, folder.conversation):
        return "busy", ""
    try:
        # Again, with nothing awaited before git runs: a link swapped in
        # since the check above is refused; one swapped in while git
        # starts is the window state_paths describes.
        refuse_links(manager.anchor, path)
        with manager.removing(folder.workspace, folder.conversation):
            await manager.git.remove_worktree(repo.path, path)
    except LinkRefused as exc:
        log.warning("not sweeping %s: %s", path, exc)
        return "refused", str(exc)
    except WorktreeDirty as exc:  # changed between the status and the removal
        return "kept-dirty", ", ".join((*exc.modified, *exc.untracked)[:5])
    except (GitError, OSError) as exc:
        log.warning("could not remove worktree %s: %s", path, exc)
        return "failed", str(exc)
    return "removed", ""
