"""Stopping the group: survivors of the leader die with it, even while they fork,
a normal end still stops processes that let go of the pipes, and a log that
fails while the group is stopped does not stop the stopping."""

from __future__ import annotations

import errno
import os
import resource
import signal
import time
from pathlib import Path

import pytest
import trio
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


# The leader exits at once and leaves a survivor that ignores SIGTERM, lets
# go of the pipes and forks a sleeping process every few milliseconds, for
# longer than the grace.
_FORKING_SURVIVOR = """
import os, signal, time
print(os.getpid(), flush=True)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    for _ in range(1000):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        time.sleep(0.002)
    os._exit(0)
"""


def _running_in_group(pgid: int) -> list[int]:
    running = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            fields = stat[stat.rfind(b")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                running.append(int(entry))
    return running


async def test_survivors_that_keep_forking_do_not_outlive_the_run(
    tmp_path: Path, exit_watch: str
) -> None:
    # The grace runs out on a survivor of a reaped leader that forks all the
    # while: the group must be killed in one step, so that no process
    # forked after a look at the members escapes the kill.
    spec = make_spec(tmp_path, argv=script(_FORKING_SURVIVOR), kill_grace=0.3)
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    pgid = int(spec.log_path.read_text().split()[0])
    deadline = time.monotonic() + 1.0  # a SIGKILL in flight lands
    while (left := _running_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


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


async def test_a_log_that_fails_while_the_group_is_stopped_still_stops_it(
    tmp_path: Path,
) -> None:
    # The log's first failure comes in the middle of the stop: the child
    # prints 200 KB when it gets SIGTERM, into a log that may not grow past
    # 100 KB (a file-size limit standing in for a full disk), and then ignores
    # the signal. The stop must go on to SIGKILL and reap the child, and only
    # then raise the log's error.
    code = (
        "import signal, sys, time\n"
        "def term(*_):\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    sys.stderr.write('s' * 200_000)\n"
        "    sys.stderr.flush()\n"
        "    time.sleep(30)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print('started', flush=True)\n"
        "time.sleep(30)\n"
    )
    spec = make_spec(tmp_path, argv=script(code), timeout=0.5, kill_grace=0.5)
    pids: list[int] = []

    class Started:
        def started(self, value: int) -> None:
            pids.append(value)

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, limit[1]))
    try:
        with trio.fail_after(10), pytest.raises(OSError, match="too large") as raised:
            await execute(spec, task_status=Started())  # type: ignore[arg-type]
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
    assert raised.value.errno == errno.EFBIG
    [pid] = pids
    assert not os.path.exists(f"/proc/{pid}")  # stopped and reaped
