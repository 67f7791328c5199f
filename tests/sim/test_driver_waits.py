"""The replay's driver waits for the tasks an event set off, and only when one was.

Without ``after`` (the replay), an event that made no task runnable, delivered
by a driver that never yielded meanwhile, is not followed by a wait for every
task to block: that wait would be a scheduling round in which nothing else
runs. What the wait did all the same must still happen at its moment: a timer
the event set due acts before the next event, and before the driving ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
import trio.testing

from herdsman.sim.replay import ARRIVAL, Driver, drive
from herdsman.sim.workload import Workload
from herdsman.trace import TraceHeader


class Rounds(trio.abc.Instrument):
    """Counts trio's scheduling rounds (one I/O wait each)."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


class Idle:
    """The supervisor as the driver reads it: running, no account to wait for."""

    def __init__(self) -> None:
        self.finished = trio.Event()
        self.account_recheck_at: float | None = None


def _driver() -> Driver:
    header = TraceHeader(1, "2026-11-30T00:00:00.000000Z", {}, None)
    return Driver(Workload(header, 0.0, (), {}))


def _rounds(events: list[Callable[[], None]], after: Callable[[], bool] | None = None) -> int:
    """Drive ``events`` one a second from t=1; the scheduling rounds it took."""
    rounds = Rounds()
    clock = trio.testing.MockClock()

    async def main() -> None:
        driver = _driver()
        for order, action in enumerate(events):
            driver.push(1.0 + order, ARRIVAL, order, action)
        trio.lowlevel.add_instrument(rounds)
        await drive(driver, Idle(), clock, after)
        trio.lowlevel.remove_instrument(rounds)

    trio.run(main, clock=clock)
    return rounds.count


def test_events_that_set_nothing_off_take_no_round_each() -> None:
    quiet = _rounds([lambda: None] * 20)
    assert quiet < 5  # the first wait, and the one owed at the end
    checked = _rounds([lambda: None] * 20, after=lambda: False)
    assert checked >= 20  # the fuzzer's checks come after a wait, always


def test_an_event_that_wakes_a_task_is_waited_for() -> None:
    order: list[str] = []

    async def main() -> None:
        driver = _driver()
        woken = [trio.Event() for _ in range(10)]

        async def sleeper(n: int) -> None:
            await woken[n].wait()
            order.append(f"woke {n}")

        def wake(n: int) -> Callable[[], None]:
            def action() -> None:
                order.append(f"set {n}")
                woken[n].set()

            return action

        async with trio.open_nursery() as nursery:
            for n in range(10):
                nursery.start_soon(sleeper, n)
                driver.push(1.0 + n, ARRIVAL, n, wake(n))
            await drive(driver, Idle(), clock)
            nursery.cancel_scope.cancel()

    clock = trio.testing.MockClock()
    trio.run(main, clock=clock)
    assert order == [f"{what} {n}" for n in range(10) for what in ("set", "woke")]


def test_a_delivery_that_yields_is_waited_for_whatever_the_wake_up_order() -> None:
    # The delivery wakes a task and then yields: driver and task may share a
    # round, the driver first, and the run queue is then empty though the
    # task has not run yet. The driver must wait all the same. (Twenty
    # times: each is a coin toss of trio's.)
    order: list[str] = []

    async def main() -> None:
        driver = _driver()
        woken = [trio.Event() for _ in range(20)]

        async def sleeper(n: int) -> None:
            await woken[n].wait()
            order.append(f"woke {n}")

        def deliver(n: int) -> Callable[[], Awaitable[None]]:
            async def delivery() -> None:
                order.append(f"set {n}")
                woken[n].set()
                await trio.lowlevel.checkpoint()

            return delivery

        async with trio.open_nursery() as nursery:
            for n in range(20):
                nursery.start_soon(sleeper, n)
                driver.push(1.0 + n, ARRIVAL, n, deliver(n))
            await drive(driver, Idle(), clock)
            nursery.cancel_scope.cancel()

    clock = trio.testing.MockClock()
    trio.run(main, clock=clock)
    assert order == [f"{what} {n}" for n in range(20) for what in ("set", "woke")]


def test_a_timer_an_event_sets_due_acts_before_the_next_event_and_the_end() -> None:
    # Each event sets a blocked task's deadline to now: no task is runnable
    # then (a due timer is not in the run queue), and the wait is skipped;
    # the timer must act before the next event all the same, and the last
    # one before driving ends.
    order: list[str] = []

    async def main() -> None:
        driver = _driver()
        scopes = [trio.CancelScope() for _ in range(3)]

        async def sleeper(n: int) -> None:
            with scopes[n]:
                await trio.sleep_forever()
            order.append(f"timed out {n}")

        def due(n: int) -> Callable[[], None]:
            def action() -> None:
                order.append(f"due {n}")
                scopes[n].deadline = trio.current_time()

            return action

        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(sleeper, n)
                # Two at one instant: the timer acts before the next event.
                driver.push(1.0 + n // 2, ARRIVAL, n, due(n))
            await drive(driver, Idle(), clock)
            order.append("driven")
            nursery.cancel_scope.cancel()

    clock = trio.testing.MockClock()
    trio.run(main, clock=clock)
    assert order == [f"{what} {n}" for n in range(3) for what in ("due", "timed out")] + ["driven"]


def test_the_driver_goes_on_without_a_round_of_its_own_when_the_woken_task_ran_first() -> None:
    # Each event wakes one task, which runs a step and blocks again. Waiting
    # for blocked tasks took two rounds an event: the task's, then one in
    # which only the driver woke. Yielding behind the task, the driver goes
    # on in the task's round whenever trio runs the task first: a coin toss
    # of trio's an event, so about 150 rounds for 100 events (fewer than
    # 180 fails once in about 10^10 replays), and still each task's step
    # before the next event.
    events = 100
    order: list[str] = []
    rounds = Rounds()

    async def main() -> None:
        driver = _driver()
        lot = trio.lowlevel.ParkingLot()

        async def parked() -> None:
            while True:
                await lot.park()
                order.append("ran")

        def wake(n: int) -> Callable[[], None]:
            def action() -> None:
                order.append(f"woke {n}")
                lot.unpark()

            return action

        async with trio.open_nursery() as nursery:
            nursery.start_soon(parked)
            for n in range(events):
                driver.push(1.0 + n, ARRIVAL, n, wake(n))
            trio.lowlevel.add_instrument(rounds)
            await drive(driver, Idle(), clock)
            trio.lowlevel.remove_instrument(rounds)
            nursery.cancel_scope.cancel()

    clock = trio.testing.MockClock()
    trio.run(main, clock=clock)
    assert order == [text for n in range(events) for text in (f"woke {n}", "ran")]
    assert events < rounds.count < 180
