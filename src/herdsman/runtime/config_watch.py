"""Following supervisor.toml on disk: tell the supervisor when it may have changed.

The file's folder is watched (watchfiles), not the file, so a file replaced
by a rename (as editors save) is followed; so is the target of a symlink,
looked up again after every change, so a swapped link (a Kubernetes
ConfigMap update) moves the watch along. A folder that disappears is waited
for. Whether the content really changed is the caller's to decide
(:func:`file_signature`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio
import watchfiles

from herdsman.config.load import read_config_bytes

__all__ = ["WATCH_SETTLE", "file_signature", "watch_file"]

log = logging.getLogger("herdsman.supervisor")

# watchfiles logs "N changes detected" at INFO for every batch in the folder:
# with the file in a checkout, every git or editor action would print a line
# (and a log written into that folder would feed itself). herdsman logs the
# reloads that follow a change; the watcher's own chatter is only for debugging.
logging.getLogger("watchfiles").setLevel(logging.WARNING)

#: How long the folder must stay quiet before a change is reported (an
#: editor's save is several writes).
WATCH_SETTLE = 0.5


def file_signature(path: Path) -> bytes | None:
    """The file's content, hashed (None: no file).

    Content, not times: two quick edits of the same length can share an
    mtime, and saving the file unchanged is no reason to reload.
    """
    try:
        return hashlib.sha256(read_config_bytes(path)).digest()
    except OSError:
        return None
    except ValueError as refused:
        # No configuration file (a FIFO, a device, a huge file): never read
        # it, but a change to it is a change, and its reload is refused.
        return hashlib.sha256(str(refused).encode()).digest()


def _watched_folders(path: Path) -> tuple[str, ...]:
    """The folders holding the file and, through symlinks, what it points at."""
    names = {os.path.abspath(path), os.path.realpath(path)}
    return tuple(sorted({os.path.dirname(name) for name in names}))


async def watch_file(path: Path, changed: Callable[[], Awaitable[None]]) -> None:
    """Call ``changed`` whenever ``path`` may have changed and has settled. Never returns."""
    warned = False
    while True:
        folders = _watched_folders(path)
        if not all(os.path.isdir(folder) for folder in folders):
            if not warned:
                log.warning("cannot watch %s: its folder is gone; waiting for it", path)
                warned = True
            await trio.sleep(WATCH_SETTLE)
            continue
        if warned:
            log.info("watching %s again", path)
            warned = False
            await changed()
        try:
            await _watch_folders(path, folders, changed)
        except Exception as error:  # the watch itself failed: look again shortly
            log.warning("watching %s failed (%s); trying again", path, error)
            await trio.sleep(WATCH_SETTLE)


async def _watch_folders(
    path: Path, folders: tuple[str, ...], changed: Callable[[], Awaitable[None]]
) -> None:
    """Until the file's folders change (a symlink swapped) or vanish."""
    # ``step`` is how long the folders must stay quiet before a batch of
    # changes is reported; ``debounce`` only caps how long a batch may grow
    # (an editor writing slowly). ``rust_timeout`` bounds how long a cancel
    # waits for the watching thread; with ``yield_on_timeout`` an empty batch
    # comes every ``rust_timeout`` too, so a deleted folder (which reports
    # nothing more) is noticed.
    changes = watchfiles.awatch(
        *folders,
        watch_filter=None,
        step=int(WATCH_SETTLE * 1000),
        debounce=10_000,
        rust_timeout=1000,
        yield_on_timeout=True,
        recursive=False,
    )
    # aclosing: leaving the loop early must stop the watching thread now, not
    # whenever the generator is garbage collected.
    # A change made after the folders were looked up but before this watch
    # was armed (say, the link swapped again while the last change was being
    # reloaded) reports nothing to it: so the first batch, empty or not
    # (one comes within ``rust_timeout``, once the watch is armed), is
    # reported as a change too. The caller compares contents, so a file
    # that did not change costs one read.
    armed = False
    async with contextlib.aclosing(changes):
        async for batch in changes:
            if batch or not armed:
                armed = True
                await changed()
            if _watched_folders(path) != folders or not all(map(os.path.isdir, folders)):
                return
