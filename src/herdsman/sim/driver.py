"""The replay's driver: the fake runner that plays each run's recorded attempts, and the
loop that delivers the trace's events one at a time on trio's mock clock.

:func:`herdsman.sim.replay.replay` runs the real supervisor under them; the
fuzz harness drives its own scenarios with them too.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio
import trio.testing

from herdsman.runtime.runner import (
    ProcessOutcome,
    ProcessSpec,
    RunCancel,
)
from herdsman.sim.fake_end import fake_end, stopped_end
from herdsman.sim.trio_internals import (
    any_woken,
    checkpoints,
    mock_time,
    next_deadline,
    runnable,
    settler,
    tasks,
)
from herdsman.sim.workload import (
    Ending,
    Executions,
    Workload,
    late_wake,
)

__all__ = ["ARRIVAL", "END", "Action", "Driven", "Driver", "drive"]

# Event kinds in the order they go at one instant: a run ending frees its
# slot before an arrival at the same moment is looked at, as in a recording
# where the finish was written first.
END, ARRIVAL = 0, 1


#: What an event does when delivered: a coroutine to await (an arrival
#: handed to the supervisor), or nothing more (a run's end wakes its task).
Action = Callable[[], Awaitable[None] | None]


class Driver:
    """The heap of external events, and the fake runner that feeds it."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._heap: list[tuple[float, int, int, int, Action]] = []
        self._pushes = 0
        self.executions = Executions(workload)
        # One outcome per way an attempt can end on its own: outcomes are
        # frozen, and building one per run cost more than the rest of the
        # fake runner's bookkeeping.
        self._outcomes: dict[Ending, ProcessOutcome] = {}
        #: Whether the driver is delivering events (it is not once the input is over).
        self.driving = False
        #: The time now: the replay reads its ``MockClock`` through :func:`mock_time`.
        self.now: Callable[[], float] = trio.current_time
        #: Events delivered (and one more once the input is over): the replay's
        #: watch for a spin or a stall (herdsman.sim.bounds) reads progress here.
        self.moves = 0
        #: The last event delivered: ``(time, kind, order)``, what a stuck replay names.
        self.last: tuple[float, int, int] | None = None

    def push(self, t: float, kind: int, order: int, action: Action) -> None:
        # ``order`` breaks ties within a kind; the counter only keeps tuples
        # comparable (it never decides: equal (t, kind, order) cannot happen).
        self._pushes += 1
        heapq.heappush(self._heap, (t, kind, order, self._pushes, action))

    def next_time(self) -> float | None:
        """When the earliest event is due, if there is one."""
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, Action] | None:
        if not self._heap:
            return None
        t, kind, order, _, action = heapq.heappop(self._heap)
        self.moves += 1
        self.last = t, kind, order
        return t, action

    async def execute(
        self,
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> ProcessOutcome:
        """The fake runner: ends when the driver says the recorded duration is up."""
        run_id = spec.env["HERDSMAN_RUN_ID"]
        plan = self.workload.plans.get(run_id)
        index = plan.index if plan is not None else len(self.workload.plans)
        attempt = self.executions.next(run_id)
        task_status.started(0)
        done = trio.Event()
        stopped: list[str] = []
        if cancel is not None:
            if cancel.cancelled:
                return stopped_end(attempt, cancel.reason)

            def on_cancel(reason: str) -> None:
                stopped.append(reason)
                if self.driving:
                    # Stopped now, but ended by the driver like any run's end:
                    # a forced shutdown stops many at once, and their ends
                    # must be recorded in arrival order, not trio's wake order.
                    self.push(self.now(), END, index, done.set)
                else:
                    done.set()

            cancel._attach(on_cancel)

        # Its end wakes this task and awaits nothing: no coroutine per run.
        # One the recording never saw end (it was cut short) never ends.
        end = attempt.end(self.now())
        if end != math.inf:
            self.push(end, END, index, done.set)
        try:
            await done.wait()
        finally:
            if cancel is not None:
                cancel._detach()
        if stopped:
            return stopped_end(attempt, stopped[0])
        key = attempt.shared_end
        if key is None:
            return fake_end(attempt, None)  # its own: what its agent's stream said
        ended = self._outcomes.get(key)
        if ended is None:
            ended = self._outcomes[key] = fake_end(attempt, None)
        return ended


class Driven(Protocol):
    """What the driver reads of the supervisor it drives (the fuzzer's changes at a restart)."""

    @property
    def finished(self) -> trio.Event: ...

    @property
    def account_recheck_at(self) -> float | None: ...


# Why the driver may skip its wait after an event.
#
# The driver waits for every task to block after each event, so that what
# an event set off is over before the next begins. An event that made no
# task runnable (a submit that queued its run: a third of the benchmark's
# arrivals), delivered by a driver that never yielded meanwhile, leaves
# every other task blocked: the driver runs alone in its round (trio wakes
# a task from wait_all_tasks_blocked only when nothing else is runnable),
# and a task it made runnable would be in the run queue. The wait would be
# a whole round of trio's in which nothing else runs: nothing to wait for,
# but for a timer the event itself set due (the replay's tasks wait on no
# I/O: the ledger runs inline, nothing spawns, no socket). Such a timer
# is met at the next pass all the same: its deadline comes first, so the
# driver jumps the clock by nothing and waits then, before the next event,
# as the skipped wait would have had it act; and with no event left, the
# owed wait is made before the supervisor's state is read. With ``after``
# (the fuzzer's checks after every event) the driver always waits.
# trio's wake-up order, which a round draws from its random generator,
# decides nothing here, as everywhere in the replay.


# Why the driver rides along with the tasks an event woke.
#
# After an event that made tasks runnable, the driver used to wait for
# every task to block: trio wakes such a waiter only in a round in which
# nothing else is runnable, a round of its own (about 48,000 instructions
# in the replay). Instead the driver yields as a plain checkpoint, which
# puts it in the run queue behind the tasks it woke: the next round runs
# them and it, in an order trio draws. When it resumes, it looks: if no
# task is to run a step (none in the run queue, none woken and not yet run
# in the round it is in: trio's own mark on each task), every other task
# is blocked, just what the wait tells; otherwise it yields again, into the
# next round with whatever is still to run. It then goes on in the round
# in which the last task it set off ran, or, if trio ran it before that
# one, in a round after (alone, as the wait's was). What each task does
# and the order in which the events are delivered do not depend on which
# round the driver learns it in: it goes on only once every other task is
# blocked. A timer due meanwhile is met as after a skipped wait: at the
# next pass its deadline comes first and the driver waits then (the note
# above); the replay's tasks wait on no I/O. With ``after`` (the fuzzer's
# checks after every event) the driver always waits.


async def _ride_along(runnable: deque[trio.lowlevel.Task]) -> None:
    """Yield until no other task is to run a step: until every other task is blocked.

    Only for a driver that runs alone in its round or after every other
    task in it (as after a wait for blocked tasks, or this), and that has
    not yielded since: then an empty run queue says it at once.
    """
    if not runnable:
        return
    living = tasks()
    while True:
        await trio.lowlevel.cancel_shielded_checkpoint()
        if not runnable and not any_woken(living):
            return


async def drive(
    driver: Driver,
    supervisor: Driven,
    clock: trio.testing.MockClock,
    after: Callable[[], bool] | None = None,
) -> None:
    """Deliver every event in order, one at a time, until nothing more can happen.

    ``after`` is called once whatever each event or timer set off has
    settled; it returns True to stop driving (the fuzzer found a violation).

    Without ``after`` (the replay), the driver does not wait for blocked
    tasks after an event: it rides along with what the event set off, if
    anything (the notes above).
    """
    now_is = mock_time(clock)
    settle = settler()
    queued = runnable()
    me = trio.lowlevel.current_task()
    owed = False  # a wait for blocked tasks skipped (see below)
    wakes = driver.workload.wakes
    # Each pass starts with every task blocked and no timer due: only the
    # driver can make something happen now.
    await settle()
    while True:
        t = driver.next_time()
        upcoming = math.inf if t is None else t  # the next event's moment
        if t is None:
            if owed:
                # Before the supervisor's state is read, as after any event.
                owed = False
                await settle()
                continue
            if supervisor.finished.is_set():
                return  # stopped (a replayed shutdown): nothing more can happen
            # Queued runs may wait for a resting account: the dispatcher's
            # timer for its return is the next thing to happen (reached
            # below, as a supervisor timer). Other timers (retention sweeps)
            # go on forever and change nothing the replay reports: a sweep
            # of the replay's takes no time, so no submit waits for it
            # (docs/simulator.md, "Worktree sweeps in a replay").
            t = supervisor.account_recheck_at
            if t is None:
                return
        now = now_is()
        to_timer = next_deadline() - now
        if to_timer <= t - now:
            # The supervisor's own timer comes first (or at the same
            # instant: it acts before the event). Jumped by the same
            # arithmetic as MockClock's autojump, so the times are the same;
            # to a later moment a start says the recorded dispatcher decided
            # at, if nothing else comes first (late_wake).
            if wakes and not supervisor.finished.is_set():
                due = now + to_timer
                late = late_wake(wakes, due, upcoming)
                if late != due:
                    to_timer = late - now
            clock.jump(max(0.0, to_timer))
            owed = False
            await settle()
            if after is not None and after():
                return
            continue
        if t > now:
            clock.jump(t - now)
        item = driver.pop()
        if item is None:
            # Nothing was due (a time to look again): look, all the same.
            if after is not None and after():
                return
            continue
        _, action = item
        passed = checkpoints(me)
        pending = action()
        if pending is not None:
            await pending
        if after is None and checkpoints(me) == passed:
            # No wait for blocked tasks: if the event set nothing off, every
            # other task is blocked already, and the wait would be a round of
            # trio's in which nothing else runs; if it did, the driver rides
            # along with what it set off (the notes above drive).
            await _ride_along(queued)
            owed = True
            continue
        owed = False
        await settle()
        if after is not None and after():
            return
