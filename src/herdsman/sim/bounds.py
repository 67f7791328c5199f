"""Bounds on a simulated run: one that stops making progress ends with a finding, never a hang.

Shared by the fuzzer's harness and the trio replay. Each runs trio in a
thread of its own (:class:`InThread`): a thread that never yields (a
blocking call in a coroutine) can only be given up on from outside, after a
limit in wall time; its verdict is given once, by whichever comes first, and
a run that cannot wind down is left asleep. Inside, the bounds are in
simulated time and in counted steps, never in seconds, so the same input
gives the same finding: the fuzzer counts trio's task steps at one
simulated instant (an instrument); the replay, where every instruction a
run costs counts (docs/simulator.md), counts trio's rounds through the
clock trio reads once a round, and finds a stall where trio would
autojump the clock (:class:`Watch`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import trio
import trio.testing

from herdsman.sim.trio_internals import WorkerJobs, mock_time, route_clock

__all__ = [
    "STEPS_AT_ONE_INSTANT",
    "STOP_GRACE",
    "WALL_LIMIT",
    "InThread",
    "Stuck",
    "Watch",
    "run_watched",
]

T = TypeVar("T")

#: How long (wall-clock seconds) one run may take at most, by default: the
#: slowest fuzz seed seen took 20 s on a shared two-core machine at a load
#: near 9, and a 100,000-run replay takes tens of seconds there, so only a
#: run that will never end meets it.
WALL_LIMIT = 300.0
#: How many task steps (the fuzzer) or rounds of trio's (the replay) may go
#: by at one simulated instant with nothing moving on: a storm of every
#: event at once takes a few thousand; a loop that never lets the clock
#: move, far more.
STEPS_AT_ONE_INSTANT = 100_000
#: How long (simulated) a supervisor told to stop, or killed, may take to stop
#: (and one started, to recover), and an event may hold the driver.
STOP_GRACE = 600.0
#: How long (wall-clock seconds) a frozen run is waited for to park, and a
#: run given up on for its jobs in trio's worker threads to end: a task step
#: under way when the wall limit came (a slow one, a blocking call), or a
#: ``trio.to_thread`` call, finishes first, and must finish on the fake
#: filesystem it began on.
FREEZE_GRACE = 30.0


class Stuck(Exception):
    """A replay stopped making progress; the message says what stopped moving, when, where."""


class InThread:
    """One ``trio.run`` in a daemon thread, bounded in wall time; its verdict given once.

    ``freeze`` (set when the wall limit is met) tells the run to stop before
    it does anything more: the fuzzer looks at every task step, the replay's
    clock at every round. A frozen or stuck run's thread sleeps for ever.
    The jobs it handed to trio's worker threads are counted: :meth:`wait`
    returns once they are over too.
    """

    def __init__(self) -> None:
        #: Set once the verdict is in (the run ended, or was given up on).
        self.done = threading.Event()
        self._lock = threading.Lock()
        #: Set (by the caller's thread) to stop the run's thread at its next look.
        self.freeze = False
        self._tokens: list[trio.lowlevel.TrioToken] = []
        self._on_freeze: list[Callable[[], None]] = []
        #: Set once the thread sleeps for ever (:meth:`abandon`).
        self._parked = threading.Event()
        self._thread: threading.Thread | None = None
        #: What the run's thread has under way in trio's worker threads.
        self.worker_jobs = WorkerJobs()

    def start(self, run: Callable[[], None], name: str) -> None:
        """Run ``run`` (which calls ``trio.run``, and :meth:`give` at its end) in its thread."""

        def counted() -> None:
            self.worker_jobs.count_here()
            run()

        self._thread = threading.Thread(target=counted, name=name, daemon=True)
        self._thread.start()

    def entered(self) -> None:
        """Inside ``trio.run``: how to wake the run to freeze it."""
        self._tokens.append(trio.lowlevel.current_trio_token())

    def on_freeze(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` (from the caller's thread) before the run is woken to freeze."""
        self._on_freeze.append(hook)

    def wait(self, wall_limit: float | None) -> bool:
        """Whether the verdict came within ``wall_limit`` seconds; if not, the run is frozen.

        Its thread stops before its next look, woken for that if it sleeps,
        and this returns once it has (at most :data:`FREEZE_GRACE` later):
        a step under way ends on the fake filesystem it began on, and the
        thread does nothing more. The verdict is then the caller's to give.
        Either way, this returns only once the run's jobs in trio's worker
        threads are over too (within :data:`FREEZE_GRACE` in all): a run
        given up on (stuck, or frozen) does not wait for them itself.
        """
        if self.done.wait(wall_limit):
            self.worker_jobs.wait_ended(time.monotonic() + FREEZE_GRACE)
            return True
        self.freeze = True
        for hook in self._on_freeze:
            hook()
        if self._tokens:
            with contextlib.suppress(trio.RunFinishedError):
                self._tokens[0].run_sync_soon(lambda: None)
        # Returned only once the thread is parked (or ended): the caller
        # leaves the fake filesystem next, and pyfakefs's patch is
        # process-wide, so a step still under way would end on the real one.
        thread = self._thread
        deadline = time.monotonic() + FREEZE_GRACE
        while thread is not None and thread.is_alive() and not self._parked.wait(0.01):
            if time.monotonic() > deadline:
                break  # a step that never ends: nothing more can be done for it
        # A job in a worker thread goes on whatever its run does, and the
        # patch is just as much its filesystem: it ends first, too.
        self.worker_jobs.wait_ended(deadline)
        return False

    def give(self, take: Callable[[], None]) -> bool:
        """Take the verdict with ``take`` unless one was given already (the first call wins)."""
        with self._lock:
            if self.done.is_set():
                return False
            take()
            self.done.set()
            return True

    def abandon(self, take: Callable[[], None]) -> NoReturn:
        """Give the verdict and stop this thread where it is, for ever (it does nothing more)."""
        if not self.freeze:  # frozen, the caller gives the verdict: the wall limit's
            self.give(take)
        self._parked.set()
        while True:
            threading.Event().wait()


class Watch:
    """The replay's ``MockClock`` at rate 0, watched for a spin and a stall where trio meets them.

    trio reads its clock once a round: ``rounds`` counts the reads, and
    every :data:`STEPS_AT_ONE_INSTANT` of them the watch looks whether the
    driver delivered an event (``progress()``, a counter it keeps anyway)
    or the clock moved since the last look; if neither, tasks keep running
    and nothing moves: a spin. trio autojumps the clock only when every
    task waits and none waits for the others to: in a replay, when the
    driver is held inside an event (or the supervisor stops, the input
    over). No timer left then, or the clock gone :data:`STOP_GRACE` past
    ``grace`` beyond where the driver was last held, is a stall. Each calls
    ``found`` once (between task steps); the second time (a run that cannot
    wind down) ``stuck``. Per read this costs less than ``MockClock``'s own
    read of the real clock, which a clock at rate 0 does not need.

    ``MockClock`` cannot be subclassed: the watch puts its two methods on
    the clock itself (private names of trio's, guarded by
    tests/unit/platform's canary).
    """

    def __init__(
        self,
        progress: Callable[[], int],
        found: Callable[[str], None],
        stuck: Callable[[], NoReturn],
        grace: float = 0.0,
    ) -> None:
        self.clock = clock = trio.testing.MockClock(autojump_threshold=0)
        self.rounds = 0
        #: Rounds until the next look: 0 to look at once (a freeze).
        self.look_at = STEPS_AT_ONE_INSTANT
        self.frozen = False
        self._progress = progress
        self._found = found
        self._stuck = stuck
        self._grace = grace
        self._seen = (-1, -1.0)
        self._held = (-1, 0.0)
        self._reported = False
        self._virtual_now = mock_time(clock)  # before the clock's reads are routed here
        route_clock(clock, self.current_time, self._autojump)

    @property
    def now(self) -> float:
        """The simulated time, not counted as a read (from any thread)."""
        return self._virtual_now()

    def current_time(self) -> float:
        """The simulated time (rate 0: only jumps move it), counting the read."""
        self.rounds += 1
        if self.rounds >= self.look_at:
            self._look()
        return self._virtual_now()

    def freeze(self) -> None:
        """From another thread: stop the run at its next round."""
        self.frozen = True
        self.look_at = 0

    def _look(self) -> None:
        if self.frozen:
            self._stuck()
        self.look_at = self.rounds + STEPS_AT_ONE_INSTANT
        seen = (self._progress(), self.now)
        if seen != self._seen:
            self._seen = seen
            return
        self._report(
            f"spin: tasks kept running for {STEPS_AT_ONE_INSTANT} rounds of trio's"
            f" at t={self.now:.3f} and the clock never moved"
        )

    def _autojump(self) -> None:
        now = self.now
        held = self._progress()
        if held != self._held[0]:
            self._held = (held, now)
        jump = trio.lowlevel.current_statistics().seconds_to_next_deadline
        if jump == float("inf"):
            self._report(f"stall: every task waits at t={now:.3f} and no timer is left")
        elif now + jump - self._held[1] > STOP_GRACE + self._grace:
            self._report(
                f"stall: every task waits at t={now:.3f} (held since t={self._held[1]:.3f}),"
                f" and the next timer, at t={now + jump:.3f}, is past the bound"
                f" of {STOP_GRACE + self._grace:g}s"
            )
        elif jump > 0:
            self.clock.jump(jump)

    def _report(self, message: str) -> None:
        if self._reported:
            self._stuck()  # it was told to wind down, and has not
        self._reported = True
        # Between steps, not inside one: a cancellation is safe there.
        trio.lowlevel.current_trio_token().run_sync_soon(self._found, message)


def run_watched(
    main: Callable[[trio.testing.MockClock], Awaitable[T]],
    *,
    progress: Callable[[], int],
    where: Callable[[], str],
    wall_limit: float | None = WALL_LIMIT,
    grace: float = 0.0,
) -> T:
    """``trio.run(main, clock)`` on a watched clock, in a thread bounded by ``wall_limit``.

    ``progress`` counts the events the driver delivered; ``where`` names
    the last one. A spin, a stall or the wall limit raises :class:`Stuck`
    with a line naming what stopped moving, at which simulated time, and
    ``where()``: the run is cancelled first, and one that cannot wind down
    is left asleep in its thread.
    """
    bound = InThread()
    findings: list[str] = []
    results: list[T] = []
    raised: list[BaseException] = []
    scope = trio.CancelScope()

    def found(message: str) -> None:
        # Named now: winding down, the driver may yet deliver an event or two.
        findings.append(f"{message}; {where()}")
        scope.cancel()

    def stuck() -> NoReturn:
        bound.abandon(lambda: None)

    watch = Watch(progress, found, stuck, grace)
    bound.on_freeze(watch.freeze)

    async def watched() -> T | None:
        bound.entered()
        with scope:
            return await main(watch.clock)
        return None

    def run() -> None:
        try:
            result = trio.run(watched, clock=watch.clock)
            if result is not None:
                results.append(result)
        except BaseException as error:  # handed to the caller's thread
            raised.append(error)
        finally:
            bound.give(lambda: None)

    bound.start(run, "replay")
    if not bound.wait(wall_limit):
        raise Stuck(
            f"wall time: no end after {wall_limit:g}s of wall time, the simulated clock at"
            f" t={watch.now:.3f}; {where()}"
        )
    if findings:
        raise Stuck(findings[0])
    if raised:
        raise raised[0]
    return results[0]
