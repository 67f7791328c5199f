"""Every private trio name herdsman reads, in one place: the replay's, and only the replay's.

The full-fidelity replay (``herdsman.sim.replay``) drives the real
supervisor under a ``MockClock`` and decides nothing by trio's wake-up
order. For that, and for speed, it reads a few of trio's private names,
each gathered here with why the public API does not do:

* :func:`shuffle_trio` seeds trio's scheduler randomness: there is no
  public way to make trio's wake-up order reproducible.
* :func:`route_clock` sends a ``MockClock``'s reads and autojumps through
  the replay's watch (``herdsman.sim.bounds.Watch``), which finds a replay
  that stopped making progress where trio reads the clock or would jump it:
  ``MockClock`` cannot be subclassed, and its autojump has no public hook.
* :func:`mock_time`, :func:`next_deadline`, :func:`settler`,
  :func:`runnable`, :func:`tasks`, :func:`any_woken`,
  :func:`plain_instruments` and :data:`checkpoints` answer what
  ``MockClock.current_time``, ``trio.lowlevel.current_statistics()``,
  ``trio.testing.wait_all_tasks_blocked``, a walk down the tree of
  nurseries and ``trio.testing.assert_no_checkpoints`` answer, at a
  fraction of their cost (docs/simulator.md gives each saving: together
  they make the replay's driver cost less than a bare trio loop).
* :class:`WorkerJobs` counts the jobs one thread (a simulated run's) hands
  to trio's worker threads and that are still under way, so that the
  simulator leaves its fake filesystem only once they are over: trio
  keeps one cache of worker threads for the process, tells no one when a
  job ends but the run that started it (asleep, if it was given up on),
  and ``trio.to_thread.run_sync`` reaches the cache through a private
  name, so only the cache itself sees every job start.

trio is pinned to one minor version (pyproject.toml), and each name has a
canary in ``tests/unit/platform/test_trio_canary.py`` that checks, with
hypothesis where it applies, that it answers what the public API answers:
an upgrade that moves one fails there first, with the reason. Production
code (``herdsman.runtime``) uses trio's public API only; nothing outside
``herdsman.sim`` imports this module.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from operator import attrgetter
from typing import Any, TypeVar

import outcome
import trio
import trio._core._run as _trio_run
import trio._core._thread_cache as _trio_thread_cache
import trio.testing
from trio._core._instrumentation import Instruments

__all__ = [
    "WorkerJobs",
    "any_woken",
    "checkpoints",
    "mock_time",
    "next_deadline",
    "plain_instruments",
    "route_clock",
    "runnable",
    "settler",
    "shuffle_trio",
    "tasks",
]


def shuffle_trio(seed: int) -> None:
    """Make trio's wake-up order a function of ``seed``, in any process; before ``trio.run``.

    trio shuffles the tasks woken in one batch with its module-level random
    generator; with its deterministic-scheduling flag set, it sorts them by
    creation first, so that seeding the generator fixes the order
    (docs/simulator.md, "What the simulator relies on").
    """
    setattr(_trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)  # noqa: B010 - a Final
    _trio_run._r.seed(seed)


#: The task's counts of cancel points and schedule points so far.
#:
#: They change exactly when the task passes a checkpoint: what
#: ``trio.testing.assert_no_checkpoints`` compares before and after its
#: block, without its generator-based context manager. The replay's driver
#: asks it around every event it delivers.
checkpoints: Callable[[trio.lowlevel.Task], tuple[int, int]] = attrgetter(
    "_cancel_points", "_schedule_points"
)


def mock_time(clock: trio.testing.MockClock) -> Callable[[], float]:
    """``clock.current_time`` as a call with no Python frame, for a clock that never runs.

    A ``MockClock`` at rate 0 (the replay's: only jumps move it) says
    ``virtual_base + 0.0 * (real clock - real_base)``, which is its
    private ``_virtual_base`` exactly; reading it skips two Python-level
    calls and a read of the real clock, about 1,000 instructions a read.
    A clock that runs is read as usual.
    """
    if clock.rate != 0:
        return clock.current_time
    return functools.partial(getattr, clock, "_virtual_base")


def route_clock(
    clock: trio.testing.MockClock,
    current_time: Callable[[], float],
    autojump: Callable[[], None],
) -> None:
    """Have trio's reads of ``clock`` and its autojumps call these instead.

    trio reads ``clock.current_time`` once a scheduling round and calls the
    private ``clock._autojump`` when every task waits (autojump threshold
    0): both through the instance, so they are set on it.
    """
    setattr(clock, "current_time", current_time)  # noqa: B010 - a method
    setattr(clock, "_autojump", autojump)  # noqa: B010


def next_deadline() -> float:
    """When the run's next timer is due (``inf``: none); only inside ``trio.run``.

    Read from trio's deadline heap: ``trio.lowlevel.current_statistics()``
    gives the same number less the time, but builds the I/O backend's
    statistics too, about 22,000 instructions a call, twice a replayed run.
    """
    return _trio_run.GLOBAL_RUN_CONTEXT.runner.deadlines.next_deadline()


def settler() -> Callable[[], Awaitable[None]]:
    """``trio.testing.wait_all_tasks_blocked``, the run's own method; only inside ``trio.run``.

    The public function is this method behind a wrapper that looks the
    runner up at every call, twice a replayed run: about 5,000 instructions
    a run.
    """
    settle: Callable[[], Awaitable[None]] = (
        _trio_run.GLOBAL_RUN_CONTEXT.runner.wait_all_tasks_blocked
    )
    return settle


def runnable() -> deque[trio.lowlevel.Task]:
    """The run's queue of tasks to run in its next round; only inside ``trio.run``.

    ``trio.lowlevel.current_statistics().tasks_runnable`` is its length,
    but builds the I/O backend's statistics too.
    """
    runq: deque[trio.lowlevel.Task] = _trio_run.GLOBAL_RUN_CONTEXT.runner.runq
    return runq


def tasks() -> set[trio.lowlevel.Task]:
    """Every task of the run, the caller's own too; only inside ``trio.run``.

    The runner's own set; the public way is a walk down the tree of
    nurseries from the root task.
    """
    living: set[trio.lowlevel.Task] = _trio_run.GLOBAL_RUN_CONTEXT.runner.tasks
    return living


def any_woken(among: Iterable[trio.lowlevel.Task]) -> bool:
    """Whether any of ``among`` has been woken and has not run its step yet.

    trio sets a task's next send as it reschedules it and clears it as it
    runs it; no public call tells it.
    """
    for task in among:
        if task._next_send_fn is not None:
            return True
    return False


class _PlainInstruments(dict[str, dict[trio.abc.Instrument, None]]):
    """trio's ``Instruments`` as a dict: its ``in`` tests answered with no Python call.

    trio's is a ``UserDict``, whose ``in`` is a Python method: trio asks
    it whether any instrument wants a hook before and after every I/O wait
    and task step and at every reschedule, about twenty times a replayed
    run. Its own methods work on ``self.data``: here the dict itself.
    """

    __slots__ = ()

    @property
    def data(self) -> dict[str, dict[trio.abc.Instrument, None]]:
        return self

    add_instrument = Instruments.add_instrument
    remove_instrument = Instruments.remove_instrument
    call = Instruments.call


def plain_instruments() -> None:
    """Give the run its instruments (usually none) in a plain dict; only inside ``trio.run``.

    ``trio.lowlevel.add_instrument`` and ``remove_instrument`` work on the
    new one as on trio's.
    """
    runner = _trio_run.GLOBAL_RUN_CONTEXT.runner
    runner.instruments = _PlainInstruments(runner.instruments.data)  # type: ignore[assignment]


R = TypeVar("R")


class WorkerJobs:
    """The jobs one thread handed to trio's worker threads that have not ended yet.

    ``trio.to_thread.run_sync`` and ``trio.lowlevel.start_thread_soon``
    alike hand their job to trio's one cache of worker threads; once
    :meth:`count_here` was called in a thread, each job that thread hands
    over is counted until its function returns (before its result is
    handed back to the run, which may be asleep for ever). Jobs handed
    over by any other thread are not counted.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = 0

    @property
    def running(self) -> int:
        """Jobs whose function has not returned yet."""
        with self._changed:
            return self._running

    def count_here(self) -> None:
        """From now on, count the jobs the calling thread hands to trio's worker threads."""
        _counting_cache()
        _COUNTED.jobs = self

    def wait_ended(self, deadline: float) -> bool:
        """Whether every counted job ended by ``deadline`` (``time.monotonic()``)."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._running == 0, max(0.0, deadline - time.monotonic())
            )

    def _started(self, function: Callable[[], R]) -> Callable[[], R]:
        with self._changed:
            self._running += 1

        def counted() -> R:
            try:
                return function()
            finally:
                with self._changed:
                    self._running -= 1
                    self._changed.notify_all()

        return counted


class _Counted(threading.local):
    jobs: WorkerJobs | None = None


_COUNTED = _Counted()


class _CountingCache(_trio_thread_cache.ThreadCache):
    """trio's thread cache, the same idle workers, counting the jobs of counted threads."""

    __slots__ = ()

    def start_thread_soon(
        self,
        fn: Callable[[], R],
        deliver: Callable[[outcome.Outcome[R]], object],
        name: str | None = None,
    ) -> None:
        jobs = _COUNTED.jobs
        super().start_thread_soon(fn if jobs is None else jobs._started(fn), deliver, name)


_CACHE_LOCK = threading.Lock()


def _counting_cache() -> None:
    """Put the counting cache in place of trio's (once a process), keeping its idle workers.

    ``trio.lowlevel.start_thread_soon``, which ``trio.to_thread.run_sync``
    calls too, reads the module's ``THREAD_CACHE`` at every call; the
    workers already started go back to the idle set they share with it.
    """
    with _CACHE_LOCK:
        cache: Any = _trio_thread_cache.THREAD_CACHE
        if isinstance(cache, _CountingCache):
            return
        counting = _CountingCache()
        counting._idle_workers = cache._idle_workers
        _trio_thread_cache.THREAD_CACHE = counting
