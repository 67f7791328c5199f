"""Paths under the state directory: never through a symbolic link, private to the user.

Agents run as the same user as the supervisor, so anything under the state
directory may have been replaced by one of them — a checkout swapped for a
link to the user's own worktree, a conversation's folder for a link to
anywhere. The rule here: **below the state directory, herdsman creates,
uses and removes nothing through a symbolic link.** The state directory
itself (the ``anchor``) is trusted as configured — it may be a link the
user made; everything below it is not.

Two strengths of guarantee, used where each fits:

* Files herdsman creates or reads below the anchor (a conversation's
  metadata, run logs) are reached by :func:`open_below`: one directory at a
  time from the anchor with ``O_NOFOLLOW | O_DIRECTORY`` and the file with
  ``O_NOFOLLOW``. The kernel refuses a link at any step, so there is no
  window between a check and the use: a link swapped in at any moment makes
  the open fail, never follow.
* Paths handed to another program — git, which takes a path, not a
  descriptor — are checked by :func:`refuse_links` (``lstat`` of every
  component below the anchor) right before the call. A process that swaps a
  component between that check and git's own lookup is not stopped; no
  path-based tool can stop it. The callers keep that window to one git call
  with nothing awaited before it.

Modes: every folder made here is ``0700`` and every file ``0600``. The
umask can only take bits away, so these hold under any umask. What an older
herdsman made readable by others is tightened (``fchmod``): a file when it
is opened for writing, a folder when :func:`make_private_dirs` walks it.
Only there: :func:`open_below` also opens files herdsman does not own the
folders of (a run's log may be ``/dev/full``, anchored at ``/``), and the
anchor itself is the user's to set.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "LinkRefused",
    "make_private_dirs",
    "open_below",
    "private_opener",
    "read_below",
    "refuse_links",
    "remove_folder_below",
    "replace_below",
]

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class LinkRefused(OSError):
    """A path below the state directory is, or goes through, something herdsman won't follow."""

    def __init__(self, path: Path, what: str = "a symbolic link") -> None:
        super().__init__(errno.ELOOP, f"{path} is {what}", str(path))
        self.path = path
        self.what = what

    def __str__(self) -> str:
        return (
            f"{self.path} is {self.what}; herdsman never creates, uses or removes anything"
            " in its state directory through one"
        )


def _parts(anchor: Path, path: Path) -> tuple[str, ...]:
    """The components of ``path`` below ``anchor`` (which it must be under)."""
    try:
        parts = path.relative_to(anchor).parts
    except ValueError:
        raise LinkRefused(path, f"not inside {anchor}") from None
    if any(part in ("..", ".") for part in parts):
        raise LinkRefused(path, f"not plainly inside {anchor}")
    return parts


def refuse_links(anchor: Path, path: Path) -> None:
    """Raise :class:`LinkRefused` if ``path`` or a folder between ``anchor`` and it is a link.

    A missing tail is fine (nothing there to follow yet); a component
    before the last that is not a folder is refused too. See the module
    docstring for the window this leaves.
    """
    current = anchor
    parts = _parts(anchor, path)
    for n, part in enumerate(parts):
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode):
            raise LinkRefused(current)
        if n < len(parts) - 1 and not stat.S_ISDIR(info.st_mode):
            raise LinkRefused(current, "not a folder")


@contextlib.contextmanager
def _walk(
    anchor: Path, parts: tuple[str, ...], *, create: bool, tighten: bool = False
) -> Iterator[int]:
    """A descriptor of ``anchor/parts...``, reached one folder at a time, never via a link.

    ``tighten``: each folder below the anchor that others may read becomes ``0700``.
    """
    if create:
        anchor.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    fd = os.open(anchor, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        current = anchor
        for part in parts:
            current = current / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, PRIVATE_DIR, dir_fd=fd)
            try:
                child = os.open(part, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
            except OSError as exc:
                # ELOOP from O_NOFOLLOW on a link; ENOTDIR from O_DIRECTORY on a
                # link, whose target O_NOFOLLOW does not look at.
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(fd, part):
                    raise LinkRefused(current) from None
                # Named by its whole path (the error names only ``part``).
                raise type(exc)(exc.errno, exc.strerror, str(current)) from None
            os.close(fd)
            fd = child
            if tighten:
                _tighten(fd, PRIVATE_DIR)
        yield fd
    finally:
        os.close(fd)


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except OSError:
        return False


def make_private_dirs(anchor: Path, path: Path) -> None:
    """Make ``path`` and every missing folder between ``anchor`` (made too) and it, ``0700``.

    Raises :class:`LinkRefused` if one of them is a link or not a folder.
    """
    with _walk(anchor, _parts(anchor, path), create=True, tighten=True):
        pass


def open_below(anchor: Path, path: Path, flags: int, *, make_dirs: bool = False) -> int:
    """``os.open(path, flags)``, with no link followed anywhere below ``anchor``.

    A file it creates is ``0600``; one opened for writing is tightened to
    ``0600`` if it was not. ``make_dirs`` makes missing folders (``0700``)
    first. Raises :class:`LinkRefused` for a link (at the file or a folder
    on the way), or ``OSError``.
    """
    *folders, name = _parts(anchor, path)
    writes = bool(flags & (os.O_WRONLY | os.O_RDWR))
    with _walk(anchor, tuple(folders), create=make_dirs) as dir_fd:
        try:
            fd = os.open(name, flags | _NOFOLLOW | _CLOEXEC, PRIVATE_FILE, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP or (exc.errno == errno.EEXIST and _is_link(dir_fd, name)):
                raise LinkRefused(path) from None
            raise
    if writes:
        _tighten(fd, PRIVATE_FILE)
    return fd


def _tighten(fd: int, mode: int) -> None:
    """Give an open file or folder ``mode`` if others may use it (an older herdsman's)."""
    with contextlib.suppress(OSError):  # not ours: left as it is
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, mode)


def read_below(anchor: Path, path: Path, *, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file at ``path``, reached as :func:`open_below`."""
    fd = open_below(anchor, path, os.O_RDONLY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LinkRefused(path, "not a regular file")
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def replace_below(anchor: Path, path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (``0600``) atomically: a new file renamed over the old.

    Neither the temporary file nor any folder on the way is reached through
    a link; a link at ``path`` itself is replaced (rename never follows it).
    The temporary file is removed if the write fails (a full disk).
    """
    *folders, name = _parts(anchor, path)
    temp = f"{name}.tmp"
    with _walk(anchor, tuple(folders), create=False) as dir_fd:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)  # a leftover, or a link planted there
        fd = os.open(
            temp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC,
            PRIVATE_FILE,
            dir_fd=dir_fd,
        )
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise


def remove_folder_below(anchor: Path, path: Path, *, leaving: str) -> bool:
    """Remove the folder ``path`` if it holds nothing but a file named ``leaving``.

    The folder is reached as :func:`open_below` reaches one, and the file is
    unlinked through that descriptor: a link swapped in for the folder at
    any moment has nothing removed through it. Returns whether it was
    removed; False (nothing done) for a folder holding anything else, or
    one that is not what was opened.
    """
    with _walk(anchor, _parts(anchor, path), create=False) as fd:
        names = os.listdir(path)
        opened, listed = os.fstat(fd), os.lstat(path)
        if (opened.st_dev, opened.st_ino) != (listed.st_dev, listed.st_ino):
            return False  # swapped since it was opened: that listing was not ours
        if any(name != leaving for name in names):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leaving, dir_fd=fd)
    os.rmdir(path)  # never follows a link (ENOTDIR)
    return True


def private_opener(path: str, flags: int) -> int:
    """An ``opener`` for :func:`open`/``io.FileIO``: ``0600``, and no link at the file itself."""
    fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, PRIVATE_FILE)
    if flags & (os.O_WRONLY | os.O_RDWR):
        _tighten(fd, PRIVATE_FILE)
    return fd
