"""Canary: what the replay's watch (herdsman.sim.bounds.Watch) relies on in trio's run loop.

The watch puts two methods on a ``MockClock`` instance (it cannot be
subclassed): ``current_time``, which trio reads once a round, where the
watch counts rounds to find a spin; and ``_autojump``, which trio calls
when every task waits and none waits for the others to, where it finds a
stall. An upgrade that stops calling either through the instance fails
here first, with the reason, rather than leaving a replay that hangs.
"""

from __future__ import annotations

from typing import NoReturn

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from herdsman.sim.bounds import Watch


def _never() -> NoReturn:
    raise AssertionError("stuck")


@given(st.integers(min_value=1, max_value=200))
def test_trio_reads_the_clock_instance_at_least_once_a_round(rounds: int) -> None:
    watch = Watch(lambda: 0, lambda _: None, _never)

    async def spin() -> None:
        for _ in range(rounds):
            await trio.lowlevel.checkpoint()

    trio.run(spin, clock=watch.clock)
    assert watch.rounds >= rounds


def test_trio_autojumps_through_the_clock_instance_when_every_task_waits() -> None:
    found: list[str] = []
    scopes: list[trio.CancelScope] = []

    def stalled(message: str) -> None:
        found.append(message)
        scopes[0].cancel()

    watch = Watch(lambda: 0, stalled, _never)

    async def main() -> float:
        with trio.CancelScope() as scope:
            scopes.append(scope)
            await trio.sleep(30)  # jumped to, as MockClock's own autojump would
            await trio.sleep(1e6)  # past the bound: a stall, and cancelled
        return trio.current_time()

    assert trio.run(main, clock=watch.clock) == 30.0
    assert found == [
        "stall: every task waits at t=30.000 (held since t=0.000), and the next timer,"
        " at t=1000030.000, is past the bound of 600s"
    ]
