"""The dashboard's snapshots: one read of the state per burst of changes, shared by every page."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
from hypothesis import example, given, settings
from hypothesis import strategies as st

from herdsman.runtime.changes import Changes
from herdsman.runtime.dashboard.snapshot import Snapshots


class Reader:
    """A state that is the change count when read, and how many reads there were."""

    def __init__(self, changes: Changes) -> None:
        self.changes = changes
        self.reads = 0

    async def __call__(self) -> int:
        self.reads += 1
        await trio.sleep(0.01)  # a read takes time: changes may land during it
        return self.changes.count


def snapshots(changes: Changes, reader: Reader) -> Snapshots:
    return Snapshots(changes, reader, lambda: 0.0, settle=0.2, min_gap=1.0)


def test_a_touch_with_nobody_waiting_only_counts() -> None:
    changes = Changes()
    changes.touch()
    changes.touch()
    assert changes.count == 2
    assert changes._next is None


async def test_a_waiter_wakes_at_the_next_touch_and_not_before() -> None:
    changes = Changes()
    woke: list[int] = []

    async def wait() -> None:
        woke.append(await changes.wait_past(0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        changes.touch()
    assert woke == [1]
    assert await changes.wait_past(0) == 1  # already past: no wait


def state_of(payload: bytes) -> Any:
    return json.loads(payload)["state"]


def test_ten_pages_share_one_read_per_burst_of_changes() -> None:
    async def main() -> None:
        changes = Changes()
        reader = Reader(changes)
        snaps = snapshots(changes, reader)
        first, payload = await snaps.current()
        assert (first, state_of(payload), reader.reads) == (1, 0, 1)
        got: list[bytes] = []

        async def page() -> None:
            _, payload = await snaps.after(first)
            got.append(payload)

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(page)
            await trio.testing.wait_all_tasks_blocked()
            for _ in range(50):  # a burst within 50 ms
                changes.touch()
                await trio.sleep(0.001)
        assert reader.reads == 2
        assert len(got) == 10
        assert all(payload is got[0] for payload in got)
        assert state_of(got[0]) == 50
        # Nothing changes for an hour: nothing is read.
        await trio.sleep(3600)
        assert await snaps.current() == (2, got[0])
        assert reader.reads == 2

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def pages_follow(gaps: list[float], pages: int) -> None:
    """``pages`` pages open together and follow while changes land ``gaps`` seconds apart.

    Every page ends up with a snapshot read after the last change, all pages
    get the same one, and there is at most one read per change and per
    ``min_gap`` second (plus the first). The pages' first reads are one read:
    they asked together, before any change. After it, a page's read starts
    ``settle`` after a change and ``min_gap`` after the previous read ends,
    and only for a change that read did not see, so every read after the
    first but the last two starts within the span of the changes, a
    ``min_gap`` apart: ``1 + (span / min_gap + 2)``.
    """

    async def main() -> None:
        changes = Changes()
        reader = Reader(changes)
        snaps = snapshots(changes, reader)
        seen: list[tuple[int, bytes]] = [(0, b"")] * pages

        async def page(i: int) -> None:
            number, payload = await snaps.current()
            seen[i] = (number, payload)
            while True:
                seen[i] = await snaps.after(seen[i][0])

        async with trio.open_nursery() as nursery:
            for i in range(pages):
                nursery.start_soon(page, i)
            await trio.testing.wait_all_tasks_blocked()
            start = trio.current_time()
            for gap in gaps:
                await trio.sleep(gap)
                changes.touch()
            span = trio.current_time() - start
            await trio.sleep(10)  # long past settle and min_gap
            nursery.cancel_scope.cancel()
        assert {payload for _, payload in seen} == {snaps.payload}
        assert state_of(snaps.payload) == len(gaps)
        assert reader.reads <= 1 + len(gaps)
        assert reader.reads <= 1 + span / 1.0 + 2

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(min_value=0, max_value=3), min_size=1, max_size=40),
    pages=st.integers(min_value=1, max_value=5),
)
@example(gaps=[0.01, 0.01, 0.0], pages=3)  # once took 4 reads, by trio's wakeup order
def test_pages_end_on_the_last_change_and_reads_stay_bounded(gaps: list[float], pages: int) -> None:
    """Whatever the changes' timing: see :func:`pages_follow`."""
    pages_follow(gaps, pages)


def test_pages_that_open_together_share_one_read_whatever_the_wakeup_order() -> None:
    """Three pages open together; a change lands as the first read ends, two more just after.

    The pages waiting for the first read took their turn after it, and
    whether a change landed before their turn depended on trio's wakeup
    order (random here: this module imports hypothesis): each of them read
    again at once, so four reads for three changes in 0.02 s. Run many
    times so that every order comes up.
    """
    failed = 0
    for _ in range(50):
        try:
            pages_follow([0.01, 0.01, 0.0], 3)
        except AssertionError:
            failed += 1
    assert failed == 0
