"""The fence keeper: a small process that kills a supervisor's agents when it can no longer.

Agents run in process groups of their own, so they outlive a supervisor
that is killed (``kill -9``, the OOM killer, a crash) and is not restarted:
they keep working in their conversations' worktrees and spending the
account. A fleet member's runs, moreover, become ``lost`` once its lease
lapses, and another member may then start the next run of each of their
conversations. The supervisor itself cannot promise that its agents die
with it: dead or paused, it does nothing. So every ``herdsman run`` starts
one keeper (fence.py), a separate process in a session of its own, and
holds the only write end of a pipe that is the keeper's stdin. A fleet
member sends through it, after every renewal, the moment its lease
certainly still holds until, on :func:`fence_clock` (docs/fleet.md says
why that moment is never after the server's end of the lease); a sole
supervisor holds no lease and sends nothing (its deadline is ``inf``). The
keeper kills (SIGKILL) the process group of every agent started under the
supervisor's state directory (found in ``/proc`` by agent_scan.py,
children included):

* when the pipe reaches end of file: the supervisor has exited, however
  (the kernel closes its descriptors, SIGKILL included), or closed its
  fence at the end of a clean stop, once its runs had ended. Then the
  keeper exits;
* for a fleet member, when that moment passes without a newer one: the
  member could not renew in time, or is paused. From then on it *stays*
  fired: it kills any agent under the state directory every :data:`SLICE`
  seconds until the pipe closes, so a member that resumes cannot start one
  that lives on.

It imports the standard library only, so it starts in about a tenth of
a second and holds about 12 MB. Run as ``python -m herdsman.runtime.fence_keeper STATE_DIR
DEADLINE`` (``inf``: no deadline, only the pipe).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import sys
import time
from typing import Final

from herdsman.runtime.agent_scan import agents_under, running_in

__all__ = [
    "GONE_WAIT",
    "SLICE",
    "Watch",
    "fence_clock",
    "in_time",
    "kill_agents",
    "main",
    "wait_gone",
]

SLICE: Final = 0.1
"""The longest the keeper sleeps before it looks at the clock again (seconds).

Sleeps are measured on a clock that stops while the machine is suspended;
the deadline is on one that does not (:func:`fence_clock`). So after a
suspend the keeper notices the deadline within one slice.
"""

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def fence_clock() -> float:
    """Seconds on the clock fence deadlines are on: ``CLOCK_BOOTTIME`` where there is one.

    It counts the time the machine was suspended (``CLOCK_MONOTONIC`` does
    not), and no one sets it (unlike the wall clock). Elsewhere, monotonic time.
    """
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()


#: How long the keeper waits, at the end, for the agents it killed to be gone.
GONE_WAIT: Final = 10.0


def kill_agents(state_dir: str) -> set[int]:
    """SIGKILL the process group of every agent started under ``state_dir``; those groups.

    The keeper's own group (a session of its own) is never one of them.
    """
    own = os.getpgid(0)
    groups = {group for found in agents_under(state_dir).values() for group in found}
    groups.discard(own)
    _kill(groups)
    return groups


def _kill(groups: set[int]) -> None:
    for group in sorted(groups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def wait_gone(groups: set[int], timeout: float = GONE_WAIT) -> bool:
    """Wait until no member of ``groups`` runs (a killed process takes a moment); whether so.

    Killed again meanwhile: a process forked just as the first signal came
    is in the group too.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if next(running_in(groups), None) is None:
                return True
        except OSError:  # no /proc to look at: the signals were all there is
            return True
        if time.monotonic() >= deadline:
            return False
        _kill(groups)
        time.sleep(0.01)


def _say(message: str) -> None:
    # The keeper's stderr is the supervisor's: its log.
    with contextlib.suppress(OSError):
        sys.stderr.write(f"herdsman fence keeper (pid {os.getpid()}): {message}\n")
        sys.stderr.flush()


class _Deadlines:
    """The deadlines the member sent through stdin, read without blocking."""

    def __init__(self) -> None:
        self.closed = False
        self._partial = b""
        os.set_blocking(0, False)

    def drain(self) -> list[float]:
        """Read what the pipe holds: its complete lines, in order; note end of file."""
        written: list[float] = []
        while not self.closed:
            try:
                chunk = os.read(0, 4096)
            except BlockingIOError:
                break
            except OSError:  # as if closed: the supervisor is gone
                chunk = b""
            if not chunk:
                self.closed = True
                break
            lines = (self._partial + chunk).split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                with contextlib.suppress(ValueError):
                    written.append(float(line))
        return written


def in_time(write_ended_at: float, deadline: float) -> bool:
    """Whether a new deadline whose write ended at ``write_ended_at`` extends the fence.

    The member's half of the rule (:meth:`herdsman.runtime.fence.Fence.extend`):
    a write that ended before the deadline in force is read by the keeper
    before it judges that deadline (:class:`Watch`); a later one may not be.
    """
    return write_ended_at < deadline


class Watch:
    """The keeper's decisions, apart from its pipe, its clock and its kills.

    At each wakeup the keeper reads the clock, then every deadline the
    member wrote, and judges them at that moment (:meth:`judge`). Once the
    deadline in force has passed it is *fired* for good.
    """

    def __init__(self, deadline: float) -> None:
        """Hold ``deadline`` (on :func:`fence_clock`); not fired."""
        self.deadline = deadline
        self.fired = False

    def judge(self, written: list[float], now: float) -> tuple[bool, float]:
        """After reading ``written`` (in order), at ``now``: kill now?, and the longest wait.

        Deadlines read once fired change nothing. Without a deadline
        (``inf``, a sole supervisor's) there is nothing to wake for but the
        pipe: the wait is ``inf``.
        """
        if not self.fired:
            if written:
                self.deadline = written[-1]
            self.fired = now >= self.deadline
        if self.fired:
            return True, SLICE
        if math.isinf(self.deadline):
            return False, math.inf
        return False, min(SLICE, self.deadline - now)


def keep(state_dir: str, deadline: float) -> None:
    """Watch the deadlines on stdin until it closes; kill the agents as the module says."""
    deadlines = _Deadlines()
    watch = Watch(deadline)
    while True:
        # The clock first, then every line the pipe holds: a line whose write
        # ended before that moment is read before the moment is judged, so
        # one the member wrote in time (in_time) is never judged late.
        now = fence_clock()
        written = deadlines.drain()
        if deadlines.closed:
            break
        was_fired = watch.fired
        kill, wait = watch.judge(written, now)
        if kill:
            if not was_fired:
                _say(
                    "the member's fleet lease was not renewed in time; killing its agents"
                    f" under {state_dir}, and any it starts, until it exits"
                )
            kill_agents(state_dir)
        with contextlib.suppress(InterruptedError):
            select.select([0], [], [], None if math.isinf(wait) else max(wait, 0.0))
    # Gone before the keeper exits: a supervisor that stops cleanly waits for
    # it (a member then leaves the fleet at once, without the margin,
    # docs/fleet.md).
    killed = kill_agents(state_dir)
    if killed:
        gone = wait_gone(killed)
        _say(
            f"the supervisor has gone; killed {len(killed)} agent process group(s) under"
            f" {state_dir}{'' if gone else ' (some processes still had not ended)'}"
        )


def main(argv: list[str] | None = None) -> int:
    """``fence_keeper STATE_DIR DEADLINE``: keep the fence; 2 for a wrong command line."""
    args = sys.argv[1:] if argv is None else argv
    try:
        state_dir, deadline = args[0], float(args[1])
    except (IndexError, ValueError):
        _say("usage: python -m herdsman.runtime.fence_keeper STATE_DIR DEADLINE")
        return 2
    # A terminal's Ctrl-C or hangup is for the supervisor, which stops its
    # agents itself; the keeper goes when its pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    keep(state_dir, deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
