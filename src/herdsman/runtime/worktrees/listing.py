"""What ``herdsman worktrees`` shows: every conversation's checkouts and their state."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import trio

from herdsman.runtime.git import GitError
from herdsman.runtime.state_paths import LinkRefused, refuse_links
from herdsman.runtime.worktrees.manager import WorktreeManager


def size_on_disk(path: Path) -> int:
    """Bytes used by the files under ``path`` (links not followed)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total


async def describe_worktrees(manager: WorktreeManager) -> list[dict[str, Any]]:
    """One entry per existing worktree, by conversation folder then repo order."""
    rows: list[dict[str, Any]] = []
    for folder in manager.folders():
        for repo in manager.known_repos:
            path = folder.path / repo.name
            if not os.path.lexists(path):
                continue
            size: int | None = None
            try:
                # Neither git nor the size count may look through a link.
                refuse_links(manager.anchor, path)
            except LinkRefused as exc:
                status, changed, size = f"refused ({exc.what})", [], 0
            else:
                try:
                    state = await manager.git.worktree_status(path)
                    status = "clean" if state.clean else "dirty"
                    changed = [*state.modified, *state.untracked]
                except (GitError, OSError) as exc:
                    status, changed = f"unknown ({exc})", []
            if size is None:
                size = await trio.to_thread.run_sync(size_on_disk, path)
            rows.append(
                {
                    "workspace": folder.workspace,
                    "conversation": folder.conversation,
                    "repo": repo.name,
                    "path": str(path),
                    "last_used": dt.datetime.fromtimestamp(folder.last_used, dt.UTC).isoformat(),
                    "status": status,
                    "changed": changed[:20],
                    "size_bytes": size,
                }
            )
    return rows
