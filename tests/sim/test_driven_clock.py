"""The replay's clock: the next timer it reports is trio's, and only the driver moves it.

The driver reads :attr:`DrivenClock.next_deadline` instead of trio's run
statistics once every task is blocked. If trio stopped handing the clock
the earliest deadline before each wait (a trio upgrade), these fail, rather
than replays quietly acting on timers at the wrong moment.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given, settings

from herdsman.sim.clock import DrivenClock
from herdsman.sim.replay import drive_until

# Each timer: (when it is due, whether it is cancelled before it fires). Due
# after the start, so that a cancelled one cannot have fired already.
timers = st.lists(st.tuples(st.floats(min_value=0.5, max_value=1000.0), st.booleans()), max_size=12)


@settings(max_examples=60, deadline=None)
@given(timers)
def test_once_all_tasks_block_the_next_deadline_is_trios(plan: list[tuple[float, bool]]) -> None:
    fired: list[tuple[float, float]] = []
    checked = 0

    async def sleeper(due: float, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep_until(due)
            fired.append((due, trio.current_time()))

    async def main() -> None:
        nonlocal checked
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, DrivenClock)
        scopes = [trio.CancelScope() for _ in plan]
        async with trio.open_nursery() as nursery:
            for (due, _), scope in zip(plan, scopes, strict=True):
                nursery.start_soon(sleeper, due, scope)
            await trio.testing.wait_all_tasks_blocked()
            # Timers that go away: the earliest left is the next deadline.
            for (_, cancelled), scope in zip(plan, scopes, strict=True):
                if cancelled:
                    scope.cancel()
            while True:
                await trio.testing.wait_all_tasks_blocked()
                statistics = trio.lowlevel.current_statistics()
                now = clock.current_time()
                assert clock.next_deadline - now == statistics.seconds_to_next_deadline
                checked += 1
                if clock.next_deadline == math.inf:
                    break
                clock.jump(max(0.0, clock.next_deadline - now))

    trio.run(main, clock=DrivenClock())
    # Every timer not cancelled fired once, at its own moment (the jumps'
    # float sums may land a hair past it, never before), in time order.
    assert sorted(due for due, _ in fired) == sorted(d for d, cancelled in plan if not cancelled)
    for due, at in fired:
        assert at >= due
        assert at == pytest.approx(due)
    assert [at for _, at in fired] == sorted(at for _, at in fired)
    assert checked >= 1


def test_time_stands_still_until_jumped() -> None:
    async def main() -> list[float]:
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, DrivenClock)
        seen = [trio.current_time()]
        await trio.testing.wait_all_tasks_blocked()  # a wait for I/O: no time passes
        seen.append(trio.current_time())
        clock.jump(2.5)
        clock.jump(0.25)
        seen.append(trio.current_time())
        return seen

    assert trio.run(main, clock=DrivenClock()) == [0.0, 0.0, 2.75]


def test_time_cannot_go_backwards() -> None:
    with pytest.raises(ValueError, match="backwards"):
        DrivenClock().jump(-1.0)


def test_driving_until_an_event_follows_the_timers_that_set_it() -> None:
    async def main() -> float:
        done = trio.Event()

        async def grace() -> None:
            await trio.sleep(30.0)
            await trio.sleep(15.0)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(grace)
            clock = trio.lowlevel.current_clock()
            assert isinstance(clock, DrivenClock)
            await drive_until(done, clock)
        return trio.current_time()

    assert trio.run(main, clock=DrivenClock()) == 45.0


def test_driving_until_an_event_nothing_can_set_says_so() -> None:
    async def main() -> None:
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, DrivenClock)
        await drive_until(trio.Event(), clock)

    with pytest.raises(RuntimeError, match="waits for nothing that can happen"):
        trio.run(main, clock=DrivenClock())
