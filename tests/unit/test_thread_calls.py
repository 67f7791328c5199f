"""ThreadCalls: a blocking function in worker threads, bounded, with a cheap hop."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from herdsman.runtime.thread_calls import ThreadCalls, thread_usage


def calls_counted(pool: str) -> int:
    usage = thread_usage().get(pool)
    return 0 if usage is None else usage.calls


class Recorder:
    """A blocking function that notes how many calls overlap and the order they start in."""

    def __init__(self, pause: float = 0.0) -> None:
        self._lock = threading.Lock()
        self._now = 0
        self.most = 0
        self.started: list[int] = []
        self.threads: set[int] = set()
        self._pause = pause

    def __call__(self, argument: int) -> int:
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)
            self.started.append(argument)
            self.threads.add(threading.get_ident())
        try:
            time.sleep(self._pause)
            if argument % 5 == 4:
                raise ValueError(f"argument {argument}")
            return argument * 10
        finally:
            with self._lock:
                self._now -= 1


@settings(max_examples=40, deadline=None)
@given(
    max_threads=st.integers(1, 4),
    delays=st.lists(st.sampled_from([0.0, 0.0005, 0.002]), min_size=1, max_size=12),
    pause=st.sampled_from([0.0, 0.001]),
)
def test_every_caller_gets_its_own_result_and_the_bound_holds(
    max_threads: int, delays: list[float], pause: float
) -> None:
    function = Recorder(pause)
    got: dict[int, object] = {}
    arrived: list[int] = []
    counted = calls_counted("property")

    async def main() -> None:
        calls = ThreadCalls(function, max_threads=max_threads, pool="property")

        async def one(argument: int) -> None:
            await trio.sleep(delays[argument])
            arrived.append(argument)
            try:
                got[argument] = await calls.call(argument)
            except ValueError as exc:
                got[argument] = str(exc)

        # A call never woken fails the example instead of hanging the run
        # (the calls take milliseconds).
        with trio.fail_after(2):
            async with trio.open_nursery() as nursery:
                for argument in range(len(delays)):
                    nursery.start_soon(one, argument)
        assert (calls.running, calls.waiting) == (0, 0)

    trio.run(main)
    assert got == {n: f"argument {n}" if n % 5 == 4 else n * 10 for n in range(len(delays))}
    # Every call made is counted once, those that raised too.
    assert calls_counted("property") - counted == len(delays)
    assert function.most <= max_threads
    if max_threads == 1:  # one at a time: in the order the calls came
        assert function.started == arrived


async def test_a_waiting_call_can_be_cancelled_and_never_runs() -> None:
    release = threading.Event()
    ran: list[str] = []

    def blocking(name: str) -> str:
        ran.append(name)
        if name == "first":
            release.wait(10)
        return name

    calls = ThreadCalls(blocking, max_threads=1, pool="test")
    results: list[str] = []

    async def first() -> None:
        results.append(await calls.call("first"))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()
            try:
                with trio.move_on_after(0.05) as scope:
                    await calls.call("second")
                assert scope.cancelled_caught
                assert calls.waiting == 0
            finally:
                release.set()  # never leave "first" blocking the thread
    assert results == ["first"]
    assert ran == ["first"]  # "second" was dropped from the queue, never made


async def test_a_running_call_finishes_and_returns_although_its_caller_was_cancelled() -> None:
    def slow(argument: int) -> int:
        time.sleep(0.2)
        return argument + 1

    calls = ThreadCalls(slow, max_threads=2, pool="test")
    result = None
    with trio.CancelScope() as scope:
        scope.deadline = trio.current_time() + 0.05
        result = await calls.call(41)
    # A spawned child must reach its caller: the cancel waits for the call.
    assert result == 42
    assert not scope.cancelled_caught
    with trio.CancelScope() as outer:  # a call made while cancelled never starts
        outer.cancel()
        await calls.call(1)
        pytest.fail("a call made while cancelled ran")
    assert outer.cancelled_caught


def test_max_threads_below_one_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="max_threads must be 1 or more, not 0"):
            ThreadCalls(str, max_threads=0, pool="test")

    trio.run(main)


class FlakyThreads:
    """``start_thread_soon`` that fails as told: a process out of threads."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.failing = 0

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if self.failing:
            self.failing -= 1
            raise RuntimeError("can't start new thread")
        self.real(*args, **kwargs)


async def test_a_thread_that_cannot_start_gives_its_slot_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = FlakyThreads(trio.lowlevel.start_thread_soon)
    monkeypatch.setattr(trio.lowlevel, "start_thread_soon", threads)
    calls: ThreadCalls[int, int] = ThreadCalls(
        lambda n: n + 1, max_threads=2, pool="test-unstarted"
    )
    counted = calls_counted("test-unstarted")
    threads.failing = 2
    for _ in range(2):
        with pytest.raises(RuntimeError, match="can't start new thread"):
            await calls.call(0)
    assert calls.running == 0
    with trio.fail_after(5):
        assert await calls.call(1) == 2
    assert calls_counted("test-unstarted") - counted == 1  # the calls never made are not counted


async def test_a_waiting_call_whose_thread_cannot_start_gets_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads = FlakyThreads(trio.lowlevel.start_thread_soon)
    monkeypatch.setattr(trio.lowlevel, "start_thread_soon", threads)
    release = threading.Event()

    def blocking(n: int) -> int:
        if n == 0:
            release.wait(10)
        return n

    calls = ThreadCalls(blocking, max_threads=1, pool="test")
    results: dict[int, object] = {}

    async def one(n: int) -> None:
        try:
            results[n] = await calls.call(n)
        except RuntimeError as exc:
            results[n] = str(exc)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(one, 1)
            await trio.testing.wait_all_tasks_blocked()
            assert calls.waiting == 1
            threads.failing = 1  # the thread for call 1, started when call 0 ends
            release.set()
        assert results == {0: 0, 1: "can't start new thread"}
        assert (calls.running, calls.waiting) == (0, 0)
        assert await calls.call(2) == 2


def burn(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU time."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


async def test_a_pool_counts_its_calls_and_the_cpu_they_used_in_their_threads() -> None:
    def work(kind: str) -> str:
        if kind == "burn":
            burn(0.05)
        elif kind == "sleep":
            time.sleep(0.2)  # wall time, next to no CPU
        else:
            raise ValueError(kind)
        return kind

    def spent(pool: str) -> tuple[int, float, float]:
        usage = thread_usage().get(pool)
        return (0, 0.0, 0.0) if usage is None else (usage.calls, usage.cpu_seconds, usage.seconds)

    before = {pool: spent(pool) for pool in ("test-busy", "test-idle")}
    busy = ThreadCalls(work, max_threads=2, pool="test-busy")
    idle = ThreadCalls(work, max_threads=2, pool="test-idle")
    # A second ThreadCalls of a pool (the next trio run's, say) adds to the same totals.
    busy_too = ThreadCalls(work, max_threads=1, pool="test-busy")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(busy.call, "burn")
        nursery.start_soon(busy_too.call, "burn")
        nursery.start_soon(idle.call, "sleep")
    with pytest.raises(ValueError, match="fail"):
        await idle.call("fail")
    (busy_calls, busy_cpu, busy_time), (idle_calls, idle_cpu, idle_time) = (
        tuple(now - then for now, then in zip(spent(pool), before[pool], strict=True))
        for pool in ("test-busy", "test-idle")
    )
    assert (busy_calls, idle_calls) == (2, 2)
    assert busy_cpu >= 0.1
    assert busy_time >= busy_cpu  # wall time: CPU and waits
    # The sleep shows in the time the calls took, not in their CPU.
    assert idle_cpu < 0.05
    assert idle_time >= 0.2
    usage = thread_usage()
    assert list(usage) == sorted(usage)  # in a stable order for whoever lists them


async def test_a_snapshot_of_the_usage_does_not_change_later() -> None:
    calls: ThreadCalls[int, int] = ThreadCalls(lambda n: n, max_threads=1, pool="test-snapshot")
    await calls.call(1)
    before = thread_usage()["test-snapshot"]
    counted = before.calls
    await calls.call(2)
    assert (before.calls, thread_usage()["test-snapshot"].calls) == (counted, counted + 1)
