"""A supervisor's side of its fence: the keeper process, and the deadlines sent to it.

fence_keeper.py says what the keeper does; docs/fleet.md what it
guarantees a fleet member, docs/operations.md a sole supervisor. Here the
supervisor starts it (:meth:`Fence.start`); a fleet member tells it each
new deadline after a renewal (:meth:`Fence.extend`) and learns when the
fence has fallen — the deadline passed before an extension, or the keeper
died or is stopped — (:meth:`Fence.wait_fallen`); a sole supervisor has no
deadline, so its fence falls only when its keeper dies or is stopped
(sole_fence.py). Either closes it at the end (:meth:`Fence.close`).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Final

import trio

from herdsman.runtime.agent_scan import is_stopped
from herdsman.runtime.fence_keeper import GONE_WAIT, fence_clock, in_time

__all__ = [
    "STOPPED_CHECK",
    "Fence",
    "earlier_keepers",
    "fence_clock",
    "wait_for_earlier_keepers",
]

log = logging.getLogger("herdsman")

_KEEPER = b"herdsman.runtime.fence_keeper"

STOPPED_CHECK: Final = 0.5
"""Seconds between two looks at whether the keeper is stopped.

A keeper stopped (SIGSTOP, a debugger holding it) kills nothing until it is
continued, so it is as good as gone; it counts as such once seen stopped at
two looks in a row, so a passing stop (a profiler's sample) is not taken for
one. A stopped keeper is thus noticed within about a second.
"""


def earlier_keepers(state_dir: Path) -> list[int]:
    """Pids of the fence keepers running for ``state_dir`` (by their command line), in order.

    Called by a supervisor holding the state directory's lock before it
    starts its own: any found is a dead predecessor's, still killing its
    agents. Nothing is found where there is no ``/proc``.
    """
    wanted = os.fsencode(state_dir)
    found = []
    try:
        pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        # "-m herdsman.runtime.fence_keeper STATE_DIR DEADLINE"
        if (_KEEPER, wanted) in itertools.pairwise(argv):
            found.append(pid)
    return found


async def wait_for_earlier_keepers(state_dir: Path, timeout: float = GONE_WAIT + 5) -> None:
    """Return once no earlier supervisor's keeper runs for ``state_dir``, or after ``timeout``.

    A supervisor started again at once (by a service manager) must not
    spawn an agent before its dead predecessor's keeper has killed the
    agents it finds under the state directory: the new agent would be among
    them.
    """
    keepers = await trio.to_thread.run_sync(earlier_keepers, state_dir)
    if not keepers:
        return
    log.info(
        "waiting for the fence keeper(s) of a previous supervisor (pid %s) to stop its agents",
        ", ".join(map(str, keepers)),
    )
    with trio.move_on_after(timeout):
        while keepers:
            await trio.sleep(0.05)
            keepers = await trio.to_thread.run_sync(earlier_keepers, state_dir)
        return
    log.warning(
        "the fence keeper(s) of a previous supervisor (pid %s) still run after %.0f s; going on",
        ", ".join(map(str, keepers)),
        timeout,
    )


class Fence:
    """The keeper of one supervisor, and the write end of its pipe (held by this process alone)."""

    def __init__(self, process: trio.Process, write_fd: int, deadline: float) -> None:
        """Take over a started keeper; :meth:`start` makes one."""
        self._process = process
        self._write_fd: int | None = write_fd
        #: The deadline the keeper holds, on :func:`fence_clock`.
        self.deadline = deadline
        #: Why the fence fell, once it has: the member's agents are (being) killed.
        self.fallen: str | None = None
        self._changed = trio.Event()

    @classmethod
    async def start(cls, state_dir: Path, deadline: float = math.inf) -> Fence:
        """Start the keeper of the agents under ``state_dir``, holding ``deadline``.

        Without one (a sole supervisor) it kills them only when the pipe closes.

        The keeper leads a session of its own (a terminal's signals are not
        for it) and gets no descriptor but its stdin, the pipe's read end.
        """
        read_fd, write_fd = os.pipe()  # both close-on-exec: no agent inherits them
        try:
            process = await trio.lowlevel.open_process(
                [
                    sys.executable,
                    "-m",
                    "herdsman.runtime.fence_keeper",
                    str(state_dir),
                    repr(deadline),
                ],
                stdin=read_fd,
                start_new_session=True,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        # Writes must never block the event loop; a keeper that stops reading
        # for 64 KiB of deadlines is as good as gone.
        os.set_blocking(write_fd, False)
        return cls(process, write_fd, deadline)

    @property
    def pid(self) -> int:
        """The keeper's process id."""
        return self._process.pid

    def extend(self, deadline: float) -> bool:
        """Tell the keeper the lease now holds until ``deadline``; whether it was in time.

        Not in time when the current deadline passed before the write ended:
        the keeper may have fired, and once fired it stays fired, so the
        fence has fallen. A later ``deadline`` is taken as it is, earlier or not
        (a reload may shorten the lease).
        """
        if self.fallen is not None or self._write_fd is None:
            return False
        try:
            os.write(self._write_fd, f"{deadline!r}\n".encode())
        except OSError as exc:  # the keeper has gone, or stopped reading
            self._fall(f"the fence keeper (pid {self.pid}) stopped taking deadlines: {exc}")
            return False
        if not in_time(fence_clock(), self.deadline):
            self._fall("the fleet lease was not renewed before its deadline")
            return False
        self.deadline = deadline
        self._wake()
        return True

    async def wait_fallen(self) -> str:
        """Return why, once the deadline passes without an extension or the keeper dies."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_keeper)
            while self.fallen is None:
                changed = self._changed
                left = self.deadline - fence_clock()
                if left <= 0:
                    self._fall("the fleet lease was not renewed before its deadline")
                    break
                with trio.move_on_after(left):
                    await changed.wait()
            nursery.cancel_scope.cancel()
        assert self.fallen is not None
        return self.fallen

    async def _watch_keeper(self) -> None:
        seen_stopped = False
        while True:
            with trio.move_on_after(STOPPED_CHECK):
                code = await self._process.wait()
                self._fall(f"the fence keeper (pid {self.pid}) exited with status {code}")
                return
            # One read of /proc/PID/stat: short enough for the event loop.
            stopped = is_stopped(self.pid)
            if stopped and seen_stopped:
                self._fall(
                    f"the fence keeper (pid {self.pid}) is stopped (SIGSTOP, or a debugger"
                    " holds it): it kills nothing until it is continued"
                )
                return
            seen_stopped = stopped

    def _fall(self, why: str) -> None:
        if self.fallen is None:
            self.fallen = why
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def close(self, timeout: float = GONE_WAIT + 5) -> None:
        """Close the pipe: the keeper kills any agent left under the state directory and exits.

        Waits for it up to ``timeout`` seconds, shielded (it is called while
        the member shuts down), then kills it. A keeper that is stopped is
        continued first: this is its last task, and the supervisor is done
        with its agents.
        """
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        if is_stopped(self.pid):
            self._process.send_signal(signal.SIGCONT)
        with trio.CancelScope(shield=True):
            with trio.move_on_after(timeout):
                await self._process.wait()
            if self._process.returncode is None:
                self._process.kill()
                await self._process.wait()

    async def discard(self) -> None:
        """Kill the keeper without letting it act, and close its pipe: it is being replaced.

        For a keeper that fell while its supervisor goes on (sole_fence.py):
        closed, a stopped keeper continued later would kill the agents of a
        supervisor still running them. Nothing happens to one that has exited.
        """
        with trio.CancelScope(shield=True):
            self._process.kill()
            await self._process.wait()
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
