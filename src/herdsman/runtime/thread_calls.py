"""``ThreadCalls``: one blocking function called in worker threads, with a cheap hop.

``trio.to_thread.run_sync`` costs the event loop about 40 µs a call more
than the hop itself here: it takes a token of a ``CapacityLimiter`` (a
checkpoint and a parking lot), copies the context, and waits in a loop that
also serves ``trio.from_thread`` requests. A run's spawn and a ledger commit need
none of that, so they go through ``trio.lowlevel.start_thread_soon`` directly: the worker
thread's result comes back with one ``run_sync_soon``.

At most ``max_threads`` calls run at a time; later ones wait in a queue and
start, in the order they came, as running ones end. A call still waiting
in the queue can be cancelled (the function is then never called); once it
runs in a thread it runs to the end and its caller gets its result, as with
``trio.to_thread.run_sync``.

Making several waiting calls in one thread job, to share one hop, was
measured and not kept: with one job at a time the spawns of a burst went
one after another and the rate fell by a third on a loaded machine, for an
event-loop time per call only a little lower (docs/performance.md).

Each ``ThreadCalls`` counts, under a pool name (``"spawn"``, ``"ledger"``),
its calls and the CPU and wall time its function took in the worker
threads: :func:`thread_usage` gives the totals of this process, which
``GET /metrics`` exports. The event loop's share of the supervisor's CPU is
its thread's CPU time; these say where the rest went, and how much of a
call's time in its thread was waiting (docs/performance.md).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

import trio

T = TypeVar("T")
R = TypeVar("R")


class ThreadUsage:
    """What one pool's calls cost in worker threads, in this process, so far."""

    __slots__ = ("calls", "cpu_seconds", "seconds")

    def __init__(self) -> None:
        #: Calls made (the function ran to its end, returning or raising).
        self.calls = 0
        #: CPU time the function used in its worker threads, user and system.
        #: The hand-off to and from the thread is not in it.
        self.cpu_seconds = 0.0
        #: Time from the function's start to its end in its threads, waits
        #: included: for the GIL, a CPU, the disk, a vfork child's exec.
        self.seconds = 0.0


_USAGE: dict[str, ThreadUsage] = {}
# Trio runs in several threads (tests) may finish calls at once: += on a
# shared total is no atomic operation.
_USAGE_LOCK = threading.Lock()


def thread_usage() -> Mapping[str, ThreadUsage]:
    """Every pool's usage so far in this process, by pool name (a snapshot)."""
    with _USAGE_LOCK:
        snapshot = {}
        for pool, usage in sorted(_USAGE.items()):
            copy = snapshot[pool] = ThreadUsage()
            copy.calls = usage.calls
            copy.cpu_seconds = usage.cpu_seconds
            copy.seconds = usage.seconds
        return snapshot


class _Call(Generic[T, R]):
    """One call: its argument, its caller, and, once made, its result or error."""

    __slots__ = ("argument", "cpu_seconds", "error", "in_thread", "result", "seconds", "task")

    def __init__(self, argument: T, task: trio.lowlevel.Task) -> None:
        self.argument = argument
        self.task = task
        self.result: R | None = None
        self.error: BaseException | None = None
        self.cpu_seconds = 0.0
        self.seconds = 0.0
        # Set once a worker thread has it: from then on it runs to the end.
        self.in_thread = False


class ThreadCalls(Generic[T, R]):
    """Calls ``function(argument)`` in worker threads, at most ``max_threads`` at once.

    Use one per trio run (it keeps the run's token), and ``call`` only from
    that run's thread. ``function`` must not call back into trio. ``name``
    names the worker thread while it makes a call (as the OS shows it);
    ``pool`` is the name its calls are counted under (see
    :func:`thread_usage`).
    """

    def __init__(
        self,
        function: Callable[[T], R],
        *,
        max_threads: int,
        pool: str,
        name: str | None = None,
    ) -> None:
        if max_threads < 1:
            raise ValueError(f"max_threads must be 1 or more, not {max_threads}")
        with _USAGE_LOCK:
            self._usage = _USAGE.setdefault(pool, ThreadUsage())
        self._function = function
        self._max_threads = max_threads
        self._name = name
        self._running = 0
        self._waiting: collections.deque[_Call[T, R]] = collections.deque()
        self._token = trio.lowlevel.current_trio_token()

    @property
    def running(self) -> int:
        """Calls running in worker threads now."""
        return self._running

    @property
    def waiting(self) -> int:
        """Calls waiting for a worker thread."""
        return len(self._waiting)

    async def call(self, argument: T) -> R:
        """``function(argument)``, made in a worker thread; its result or its exception."""
        await trio.lowlevel.checkpoint_if_cancelled()
        call: _Call[T, R] = _Call(argument, trio.lowlevel.current_task())
        if self._running < self._max_threads:
            self._start(call)
        else:
            self._waiting.append(call)

        def abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            if call in self._waiting:  # not started: it never runs
                self._waiting.remove(call)
                return trio.lowlevel.Abort.SUCCEEDED
            if not call.in_thread:
                # Out of the queue and in no thread: only a start that
                # failed leaves a call so, and _done hands its caller the
                # error at once. Should that hand-off ever be missed, a
                # cancel still frees the caller rather than leave it hung.
                return trio.lowlevel.Abort.SUCCEEDED
            return trio.lowlevel.Abort.FAILED

        await trio.lowlevel.wait_task_rescheduled(abort)
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]  # set, since error is None

    def _start(self, call: _Call[T, R]) -> None:
        self._running += 1
        try:
            trio.lowlevel.start_thread_soon(
                lambda: self._make(call),
                # In the worker thread: back to the event loop with one wake-up.
                lambda _: self._token.run_sync_soon(self._done, call),
                name=self._name,
            )
        except BaseException:
            self._running -= 1  # no thread holds this slot
            raise
        call.in_thread = True

    def _make(self, call: _Call[T, R]) -> None:
        # In the worker thread. Whatever the function raises is the caller's
        # to see, re-raised in its task.
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            call.result = self._function(call.argument)
        except BaseException as exc:
            call.error = exc
        call.cpu_seconds = time.thread_time() - cpu_started
        call.seconds = time.perf_counter() - started

    def _done(self, call: _Call[T, R]) -> None:
        with _USAGE_LOCK:
            self._usage.calls += 1
            self._usage.cpu_seconds += call.cpu_seconds
            self._usage.seconds += call.seconds
        self._running -= 1
        trio.lowlevel.reschedule(call.task)
        while self._waiting and self._running < self._max_threads:
            waiting = self._waiting.popleft()
            try:
                self._start(waiting)
            except Exception as exc:  # "can't start new thread": that caller gets it
                waiting.error = exc
                trio.lowlevel.reschedule(waiting.task)
