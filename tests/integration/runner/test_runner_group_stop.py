"""Stopping the group: survivors of the leader die without a killpg after its reaping,
and a normal end still stops processes that let go of the pipes."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest
from runner_helpers import make_spec, script, wait_gone

from herdsman.runtime.runner import execute
from herdsman.runtime.runner.spec import Outcome

# The leader starts a grandchild (in its group) that ignores SIGTERM and
# has let go of the pipes, prints its pid, and then, depending on the
# argument, sleeps or exits at once.
_GRANDCHILD = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the fork inherits it
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(30)
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
print(f"grandchild {pid}", flush=True)
if sys.argv[1] == "sleep":
    time.sleep(30)
"""


def _grandchild(log_path: Path) -> int:
    return int(log_path.read_text().split()[1])


def _record_killpg(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, bool]]:
    """Wrap os.killpg: each call's group, signal, and whether the leader was reaped by then."""
    calls: list[tuple[int, int, bool]] = []
    real = os.killpg

    def killpg(pgid: int, signum: int) -> None:
        # An unreaped leader, even a zombie, still has its /proc entry.
        calls.append((pgid, signum, not os.path.exists(f"/proc/{pgid}")))
        real(pgid, signum)

    monkeypatch.setattr(os, "killpg", killpg)
    return calls


async def test_survivors_of_a_reaped_leader_are_killed_without_a_killpg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once the leader is reaped, its group id stays taken only while a
    # member lives; a killpg after the last one died could hit a group that
    # took the id since. The grace runs out on a survivor: it must be
    # killed through a pidfd, and every real signal sent by group must
    # precede the reaping.
    calls = _record_killpg(monkeypatch)
    spec = make_spec(tmp_path, argv=(*script(_GRANDCHILD), "sleep"), timeout=0.5, kill_grace=0.3)
    outcome = await execute(spec)
    assert outcome.status is Outcome.TIMED_OUT
    assert outcome.exit_code == -15  # the leader went at SIGTERM
    grandchild = _grandchild(spec.log_path)
    assert wait_gone(grandchild)
    leader = next(pgid for pgid, signum, _ in calls if signum != 0)
    signals = [(signum, reaped) for pgid, signum, reaped in calls if pgid == leader and signum]
    assert signals
    assert all(not reaped for _, reaped in signals)


async def test_without_pidfds_survivors_are_still_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An old kernel or a sandbox: pidfd_open fails with ENOSYS. The group
    # is then killed by killpg, the best left, rather than not at all.
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    spec = make_spec(tmp_path, argv=(*script(_GRANDCHILD), "sleep"), timeout=0.5, kill_grace=0.3)
    started = time.monotonic()
    outcome = await execute(spec)
    assert outcome.status is Outcome.TIMED_OUT
    assert wait_gone(_grandchild(spec.log_path))
    assert time.monotonic() - started < 5


async def test_a_normal_end_stops_a_grandchild_that_let_go_of_the_pipes(
    tmp_path: Path, exit_watch: str
) -> None:
    # Both pipes reach EOF with the leader's exit, so nothing waits for the
    # grandchild: the group must be stopped all the same.
    spec = make_spec(tmp_path, argv=(*script(_GRANDCHILD), "exit"), kill_grace=0.3)
    started = time.monotonic()
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.exit_code == 0
    assert wait_gone(_grandchild(spec.log_path), within=0.5)
    assert time.monotonic() - started < 3


async def test_a_log_that_cannot_be_written_raises_and_still_stops_the_group(
    tmp_path: Path,
) -> None:
    # /dev/full fails every write with ENOSPC. The run must fail with that
    # error, itself, and yet leave no process behind, the child reaped,
    # although the child ignores SIGTERM and keeps printing while it is
    # being stopped.
    code = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "while True:\n    print('x' * 100, flush=True)\n    time.sleep(0.001)\n"
    )
    spec = make_spec(tmp_path, argv=script(code), log_path=Path("/dev/full"), kill_grace=0.3)
    pids: list[int] = []

    class Started:
        def started(self, value: int) -> None:
            pids.append(value)

    with pytest.raises(OSError, match="No space left") as raised:
        await execute(spec, task_status=Started())  # type: ignore[arg-type]
    assert raised.value.errno == errno.ENOSPC
    [pid] = pids
    assert not os.path.exists(f"/proc/{pid}")  # stopped and reaped, not a zombie
