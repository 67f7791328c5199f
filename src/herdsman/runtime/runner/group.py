"""Stopping what is left of a run's process group: SIGTERM, then SIGKILL after a grace.

The child leads its own group, so its pid is the group id. SIGTERM goes to
the whole group while the child is not yet reaped: an unreaped child keeps
its pid, and so the group id, from being reused, which makes ``killpg``
safe. At a normal end the child has exited and nobody else is in its
group: one ``killpg``, one ``waitpid`` and one ``killpg(pgid, 0)`` that
finds the group gone, and no awaiting (:func:`stop_at_once`).

Otherwise (:func:`stop_group`) the child is given ``grace`` seconds to exit,
unreaped; if it does not, SIGKILL goes to the group, still safe. Once the
child is reaped, processes it left in the group keep the group id taken
only while one of them lives. Those survivors are watched until they are
gone or the grace runs out, then SIGKILLed by ``killpg`` right after a
check that one is still running: the kernel signals the whole group in one
step, so a survivor that keeps forking cannot slip a new process past it (a
scan of the members followed by a kill of each could). What is left is a
window of microseconds between that check and the signal: if every
survivor died in it and the pid counter wrapped round to the group id, a
new group that took the id would get the SIGKILL. Pinning the id for good
would mean keeping the leader unreaped until the end, and then telling its
zombie apart from live members needs a scan of ``/proc`` for every run,
the usual end included.

A group counts as empty when all its members are zombies: an init that
never reaps orphans (common in containers) must not make every stop wait
the full grace.
"""

from __future__ import annotations

import os
import signal
from typing import Final

import trio

from herdsman.runtime.agent_scan import running_members as _running_members
from herdsman.runtime.runner.child import Child
from herdsman.runtime.runner.output import Output

POLL: Final = 0.02
"""How often a stopping group is checked for survivors (seconds)."""


def _signal_group(pgid: int, signum: int) -> None:
    # try/except, not contextlib.suppress: every run passes here, and the
    # context manager cost more than the signal.
    try:  # noqa: SIM105
        os.killpg(pgid, signum)
    except ProcessLookupError:  # the whole group is gone already
        pass


def group_signalable(pgid: int) -> bool:
    """Whether any process, zombies included, is left in group ``pgid`` (one syscall)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    try:
        return next(_running_members(pgid), None) is not None
    except OSError:
        return True  # cannot look: assume the worst, and let the grace decide


def _kill_if_alive(pgid: int) -> None:
    """SIGKILL group ``pgid`` right after finding a member that still runs (blocking)."""
    if _group_alive(pgid):
        _signal_group(pgid, signal.SIGKILL)


def stop_at_once(child: Child) -> bool:
    """SIGTERM the child's group and reap the child if it exited; whether that was all.

    True when the child was reaped and nobody is left in its group: the
    usual end, done without awaiting anything.
    """
    pgid = child.pid  # the child leads its own group (start_new_session)
    _signal_group(pgid, signal.SIGTERM)
    return child.reap() is not None and not group_signalable(pgid)


async def stop_group(child: Child, output: Output, grace: float) -> None:
    """Stop what is left of the child's group (see the module docstring) and reap the child.

    Call :func:`stop_at_once` first: this continues where it left off. The
    child's output is still read meanwhile.
    """
    pgid = child.pid
    deadline = trio.current_time() + grace
    with trio.move_on_at(deadline):
        await child.pump(output, child.has_exited)
    if child.reap() is None:
        _signal_group(pgid, signal.SIGKILL)  # the child is unreaped: the group id is ours
        await child.pump(output, child.has_exited)
        child.reap()
        return
    # The usual case, a group that died with its leader, needs one syscall;
    # only a group that seems alive is looked at closely (a scan of /proc,
    # in a worker thread).
    while group_signalable(pgid) and await trio.to_thread.run_sync(_group_alive, pgid):
        if trio.current_time() >= deadline:
            await trio.to_thread.run_sync(_kill_if_alive, pgid)
            return
        with trio.move_on_after(POLL):  # a sleep that keeps reading the output
            await child.pump(output, lambda: False)
