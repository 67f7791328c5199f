"""Spawning: the log and the child are made off the event loop, and the exit is
seen through a pidfd, or, where there is none, through waitid in a thread."""

from __future__ import annotations

import errno
import gc
import os
import select
import threading
import time
from pathlib import Path

import pytest
import trio
from runner_helpers import (
    demo,
    make_spec,
    run_into,
    script,
)

from herdsman.runtime.runner import (
    ExcerptBuilder,
    PlainAdapter,
    ProcessOutcome,
    ProcessSpec,
    execute,
)
from herdsman.runtime.runner import spawn as spawn_module
from herdsman.runtime.runner.child import Child
from herdsman.runtime.runner.output import Output
from herdsman.runtime.runner.spec import Outcome


async def test_a_run_ends_with_its_childs_verdict(tmp_path: Path, exit_watch: str) -> None:
    spec = make_spec(tmp_path, argv=demo("--delay", "0.2"))
    started = time.monotonic()
    outcome = await execute(spec)
    assert time.monotonic() - started < 3  # the exit was seen, not the 20 s timeout
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.result == "demo reply: say hello\n"
    failing = make_spec(tmp_path, argv=demo("--delay", "0", "--fail"))
    assert (await execute(failing)).exit_code == 1


async def test_the_log_is_opened_off_the_event_loop(tmp_path: Path) -> None:
    # Opening a FIFO for writing blocks until someone opens it for reading:
    # a stand-in for a file system that is slow to create a file. The event
    # loop must keep running meanwhile, and the child must not start before
    # its log is open.
    log_path = tmp_path / "run.log"
    os.mkfifo(log_path)
    spec = make_spec(tmp_path, argv=demo("--delay", "0"), log_path=log_path)
    # Should the open block the event loop, this unblocks it after a while,
    # so the test fails instead of hanging.
    rescue = threading.Timer(3.0, lambda: os.close(os.open(log_path, os.O_RDONLY | os.O_NONBLOCK)))
    rescue.start()
    ticks = 0
    spawned_at_tick: list[int] = []

    class Started:
        def started(self, value: int) -> None:
            spawned_at_tick.append(ticks)

    outcomes: list[ProcessOutcome] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: run_into(outcomes, spec, task_status=Started())  # type: ignore[arg-type]
            )
            for _ in range(5):
                await trio.sleep(0.05)
                ticks += 1
            assert spawned_at_tick == []  # the child waits for its log
            reader = os.open(log_path, os.O_RDONLY | os.O_NONBLOCK)
            try:
                while not outcomes:
                    await trio.sleep(0.01)
                log = b""  # the writer closed it: read to the end
                while chunk := os.read(reader, 65536):
                    log += chunk
            finally:
                os.close(reader)
    finally:
        rescue.cancel()
    assert spawned_at_tick == [5]
    [outcome] = outcomes
    assert outcome.status is Outcome.SUCCEEDED
    assert log == b"demo reply: say hello\n"


COUNT_STDIN = script("import sys; print(len(sys.stdin.buffer.read()))")


async def _spawn_and_read(spec: ProcessSpec, prompt_wanted: bool) -> tuple[Child, memoryview, str]:
    """spawn() called directly: the child, the prompt it left, its stdout once it has exited."""
    child, log = spawn_module.spawn((spec, lambda: prompt_wanted))
    left = child.prompt_rest
    with log:
        output = Output(log, PlainAdapter(), ExcerptBuilder())
        await child.pump(output, lambda: child.exited and output.all_closed())
        assert child.reap() is not None
        child.close()
    return child, left, spec.log_path.read_text()


async def test_the_prompt_is_written_and_stdin_closed_by_the_spawn_job(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, argv=COUNT_STDIN, prompt="é" * 10)
    child, left, output = await _spawn_and_read(spec, prompt_wanted=True)
    assert len(left) == 0  # nothing was left for the event loop to write
    assert output == "20\n"
    assert child.returncode == 0


async def test_a_prompt_larger_than_the_pipe_leaves_the_rest_to_the_runner(
    tmp_path: Path,
) -> None:
    spec = make_spec(tmp_path, argv=COUNT_STDIN, prompt="x" * 200_000)
    _child, left, output = await _spawn_and_read(spec, prompt_wanted=True)
    assert 0 < len(left) < 200_000
    assert output == "200000\n"


async def test_a_prompt_no_longer_wanted_is_not_written(tmp_path: Path) -> None:
    # A run cancelled while its child was being spawned: stdin is closed empty.
    spec = make_spec(tmp_path, argv=COUNT_STDIN, prompt="secret plan")
    _child, left, output = await _spawn_and_read(spec, prompt_wanted=False)
    assert len(left) == 0
    assert output == "0\n"


async def test_a_prompt_that_cannot_be_encoded_raises_before_anything_is_spawned(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "spawned"
    spec = make_spec(
        tmp_path,
        argv=script(f"open({str(marker)!r}, 'w').close()"),
        prompt="half a pair: \ud800",
    )
    with pytest.raises(UnicodeEncodeError):
        await execute(spec)
    await trio.sleep(0.5)  # time enough for a child, had one been spawned
    assert not marker.exists()


async def test_waiting_for_exits_without_a_pidfd_takes_no_default_thread_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a pidfd each running child is watched by a thread for its
    # whole life. Those threads must not come out of trio's default limiter
    # (40 tokens, here 1): a child beyond it would not be seen ending, and
    # every other worker-thread call in the process would wait.
    monkeypatch.setattr(spawn_module, "_pidfd", lambda pid: None)
    monkeypatch.setattr(trio.to_thread.current_default_thread_limiter(), "total_tokens", 1)
    cancel_long = trio.CancelScope()
    outcomes: list[ProcessOutcome] = []

    async def long_run() -> None:
        with cancel_long:
            await execute(
                make_spec(tmp_path, argv=demo("--delay", "30"), log_path=tmp_path / "long.log")
            )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(long_run)
        await trio.sleep(0.3)  # the long child is running and watched
        with trio.fail_after(5):
            await trio.to_thread.run_sync(lambda: None)
        short = make_spec(
            tmp_path, argv=demo("--delay", "0"), timeout=3, log_path=tmp_path / "short.log"
        )
        outcomes.append(await execute(short))
        cancel_long.cancel()
    [outcome] = outcomes
    assert outcome.status is Outcome.SUCCEEDED


async def test_a_failure_after_the_spawn_kills_and_reaps_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run's epoll is made after the fork-exec: should that fail (out of
    # descriptors), the child must not run on without an owner, and nothing
    # of the spawn may stay open.
    pids: list[int] = []
    real_exit_fd = spawn_module._exit_fd

    def recording_exit_fd(pid: int) -> int:
        pids.append(pid)
        return real_exit_fd(pid)

    def no_epoll() -> select.epoll:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(spawn_module, "_exit_fd", recording_exit_fd)
    monkeypatch.setattr(select, "epoll", no_epoll)
    spec = make_spec(tmp_path, argv=script("import time; time.sleep(30)"))
    # An earlier test's garbage (a file object nobody closed) must not be
    # collected, closing its descriptor, between the two counts.
    gc.collect()
    open_before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="Too many open files"):
        await execute(spec)
    [pid] = pids
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped
    assert len(os.listdir("/proc/self/fd")) == open_before
