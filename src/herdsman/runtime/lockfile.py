"""One supervisor per state directory, enforced with an advisory file lock."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from herdsman.runtime.state_paths import PRIVATE_DIR, private_opener


class StateDirLocked(Exception):
    """Another live process holds the state directory."""


class StateDirLock:
    """An exclusive ``flock`` on ``<state_dir>/supervisor.lock`` holding our pid.

    The kernel drops the lock when the process dies, even by SIGKILL, so a
    stale file never blocks a restart; the pid inside is only for the message.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "supervisor.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`StateDirLocked` naming the holder."""
        # The first thing a start makes: the state directory is private
        # from the start (it holds the ledger, prompts included, and the token).
        self.path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        fd = private_opener(str(self.path), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StateDirLocked(
                f"another herdsman supervisor (pid {holder}) is using {self.path.parent}; "
                "stop it first, or point this one at another state_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays; its content is stale from now on)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StateDirLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
