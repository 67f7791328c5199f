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
only while one of them lives: a ``killpg`` after the last one died could
hit a new group that took the id. So those survivors are killed one by
one, each through a pidfd opened and checked first
(:func:`kill_members`), never by a ``killpg``.

A group counts as empty when all its members are zombies: an init that
never reaps orphans (common in containers) must not make every stop wait
the full grace.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from typing import Final

import trio

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


def _state_and_group(pid: int | str) -> tuple[bytes, int] | None:
    """The state letter and the process group of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    # Fields after the parenthesised command name: state, ppid, pgrp, ...
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 3:
        return None
    return fields[0], int(fields[2])


def group_members(pgid: int) -> list[int]:
    """The pids of the processes of group ``pgid`` still running (zombies don't count)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    members = []
    for entry in entries:
        if entry.isdigit():
            found = _state_and_group(entry)
            if found is not None and found[1] == pgid and found[0] not in (b"Z", b"X"):
                members.append(int(entry))
    return members


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def kill_members(pgid: int) -> None:
    """SIGKILL each running member of group ``pgid`` through a pidfd (blocking: a /proc scan).

    For a group whose leader was reaped. A pidfd names one process for good,
    and a process found in the group after its pidfd was opened is a member:
    the group still exists, so its id cannot have been reused. Without
    pidfds (an old kernel or a sandbox) this falls back to ``killpg``, open
    to the reuse race above, however unlikely.
    """
    for pid in group_members(pgid):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone since the scan
        except OSError as error:
            if error.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
                _signal_group(pgid, signal.SIGKILL)
                return
            raise
        try:
            found = _state_and_group(pid)
            if found is not None and found[1] == pgid:
                with contextlib.suppress(ProcessLookupError):  # exited since the check
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)


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
            await trio.to_thread.run_sync(kill_members, pgid)
            return
        with trio.move_on_after(POLL):  # a sleep that keeps reading the output
            await child.pump(output, lambda: False)
