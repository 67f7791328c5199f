"""A forced stop's cancelled runs record their ends in submission order, however they stop."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from herdsman.runtime.stop_order import StopOrder

DEADLINE = 15.0


def recorded_order(
    stops: list[float], recorded_early: set[int], never: set[int]
) -> tuple[list[int], float]:
    """Run i (submitted i-th) stops after ``stops[i]`` s; the order the ends were recorded in.

    Runs in ``recorded_early`` recorded before the stop reached them (they
    never wait); runs in ``never`` never get to record at all.
    """
    order: list[int] = []
    ids = tuple(f"r{n}" for n in range(len(stops)))
    last = 0.0

    async def main() -> None:
        nonlocal last
        turns = StopOrder(ids, DEADLINE)

        async def run(n: int) -> None:
            nonlocal last
            await trio.sleep(stops[n])
            if n in recorded_early:
                order.append(n)
                turns.done(ids[n])
                return
            await turns.wait_turn(ids[n], n)
            order.append(n)
            last = trio.current_time()
            turns.done(ids[n])

        async with trio.open_nursery() as nursery:
            for n in range(len(stops)):
                if n not in never:
                    nursery.start_soon(run, n)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return order, last


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=1, max_size=6), st.data())
def test_the_ends_are_recorded_in_submission_order(stops: list[float], data: st.DataObject) -> None:
    early = data.draw(st.sets(st.sampled_from(range(len(stops)))))
    order, last = recorded_order(stops, early, set())
    waited = [n for n in order if n not in early]
    assert waited == sorted(waited)
    assert sorted(order) == list(range(len(stops)))
    # Each waits only for the last of the others to stop, never for the deadline.
    assert last <= max(stops)


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=5))
def test_a_run_that_never_stops_holds_the_others_back_only_until_the_deadline(
    stops: list[float],
) -> None:
    order, last = recorded_order(stops, set(), {0})
    assert sorted(order) == list(range(1, len(stops)))
    assert last == DEADLINE
