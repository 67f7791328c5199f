"""The ledger writer with the real store's worker threads: order, all or
nothing, and every caller answered, when commits fail or the writer stops."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import outcome
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from herdsman.runtime.ledger import Ledger, LedgerBroken, LedgerClosed
from herdsman.runtime.store import MemoryStore, NewRun, RunRecord, Store, StoreError


class GatedStore(MemoryStore):
    """Holds its first batch until released."""

    def __init__(self) -> None:
        super().__init__()
        self.first_in = threading.Event()
        self.release_first = threading.Event()
        self.applied = 0

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        self.applied += 1
        if self.applied == 1:
            self.first_in.set()
            self.release_first.wait(10)
        return super().apply(operations, durable=durable)


def in_seq_order(store: Store) -> list[str]:
    """The ids of every run in the store, oldest submit first."""
    return [r.id for r in sorted(store.list_runs(limit=1000), key=lambda r: r.seq)]


def submit(run_id: str) -> Callable[[Store], tuple[RunRecord, bool]]:
    return lambda s: s.submit(NewRun(id=run_id, provider="p", prompt="x"), 1.0)


async def test_a_cancelled_writer_settles_the_batch_in_its_thread_and_fails_the_queue() -> None:
    store = GatedStore()
    ledger = Ledger(store)
    with trio.fail_after(10):
        with trio.CancelScope() as writer:
            async with trio.open_nursery() as nursery:
                await nursery.start(ledger.run)
                first = ledger.enqueue(submit("a"))
                await trio.to_thread.run_sync(store.first_in.wait, 10)
                second = ledger.enqueue(submit("b"))  # queued while the first commits
                writer.cancel()
                store.release_first.set()
        assert (await ledger.result(first))[0].id == "a"
        with pytest.raises(LedgerClosed, match="the run ledger is closed"):
            await ledger.result(second)
    assert in_seq_order(store) == ["a"]


class Op:
    """A submit of ``run_id``; a bad one raises after submitting (undone by the store)."""

    def __init__(self, run_id: str, bad: bool) -> None:
        self.run_id = run_id
        self.bad = bad

    def __call__(self, store: Store) -> str:
        store.submit(NewRun(id=self.run_id, provider="p", prompt="x"), 1.0)
        if self.bad:
            raise ValueError(self.run_id)
        return self.run_id


class FlakyStore(MemoryStore):
    """Fails the commits whose number is in ``failing`` halfway through, keeping nothing."""

    def __init__(self, failing: set[int]) -> None:
        super().__init__()
        self.failing = failing
        self.batches: list[tuple[list[str], bool]] = []  # run ids, and whether it failed

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        ids = [op.run_id for op in operations if isinstance(op, Op)]
        failed = len(self.batches) in self.failing
        self.batches.append((ids, failed))
        if failed:
            # Half of it applied somewhere that is then thrown away: the
            # commit fails midway and nothing of the batch is kept.
            MemoryStore().apply(operations[: len(operations) // 2])
            raise StoreError("disk I/O error")
        return super().apply(operations, durable=durable)


@settings(max_examples=40, deadline=None)
@given(
    groups=st.lists(
        st.tuples(
            st.integers(0, 2),  # which enqueuing task
            st.lists(st.booleans(), min_size=1, max_size=3),  # ops of the group: bad?
            st.sampled_from([0.0, 0.0, 0.0005]),  # pause before it
        ),
        min_size=1,
        max_size=12,
    ),
    failing=st.sets(st.integers(0, 8), max_size=4),
)
def test_batches_commit_in_order_all_or_nothing_and_every_caller_hears(
    groups: list[tuple[int, list[bool], float]], failing: set[int]
) -> None:
    store = FlakyStore(failing)
    enqueued: list[str] = []  # the ledger's order
    group_of: dict[str, int] = {}
    called_back: list[str] = []
    heard: dict[str, str] = {}

    async def main() -> None:
        ledger = Ledger(store)
        async with trio.open_nursery() as outer:
            await outer.start(ledger.run)

            async def enqueuer(me: int) -> None:
                for number, (who, bads, pause) in enumerate(groups):
                    if who != me:
                        continue
                    await trio.sleep(pause)
                    pending = []
                    # No checkpoint between the enqueues of a group.
                    for index, bad in enumerate(bads):
                        run_id = f"g{number}-{index}"
                        enqueued.append(run_id)
                        group_of[run_id] = number
                        pending.append(
                            (run_id, ledger.enqueue(Op(run_id, bad), then=called_back.append))
                        )
                    for run_id, call in pending:
                        try:
                            heard[run_id] = await ledger.result(call)
                        except ValueError:
                            heard[run_id] = "bad"
                        except StoreError as exc:
                            heard[run_id] = f"store error: {exc}"

            with trio.fail_after(10):  # a caller never woken fails instead of hanging
                async with trio.open_nursery() as callers:
                    for me in range(3):
                        callers.start_soon(enqueuer, me)
            outer.cancel_scope.cancel()

    trio.run(main)
    bad = {f"g{n}-{i}" for n, (_, bads, _) in enumerate(groups) for i, b in enumerate(bads) if b}
    failed = {run_id for ids, f in store.batches if f for run_id in ids}
    committed = [r for r in enqueued if r not in failed and r not in bad]
    # Batches took the queue in order, whole groups at a time.
    assert [r for ids, _ in store.batches for r in ids] == enqueued
    for ids, _ in store.batches:
        groups_in = {group_of[r] for r in ids}
        assert all(set(ids) >= {r for r in enqueued if group_of[r] == g} for g in groups_in)
    # Every caller heard: its value, its own error, or the failed commit's.
    assert heard == {
        r: "store error: disk I/O error" if r in failed else "bad" if r in bad else r
        for r in enqueued
    }
    # Callbacks ran for the committed calls only, in the ledger's order,
    # and the store holds exactly those, in that order.
    assert called_back == committed
    assert in_seq_order(store) == committed


class BrokenStore(GatedStore):
    """Its first batch raises something no store should: not a StoreError."""

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        if self.applied == 0:
            self.applied += 1
            self.first_in.set()
            self.release_first.wait(10)
            raise RuntimeError("driver bug")
        return super().apply(operations, durable=durable)


async def test_a_batch_that_breaks_the_writer_answers_its_callers_and_ends_the_chain() -> None:
    store = BrokenStore()
    ledger = Ledger(store)
    with trio.fail_after(10), pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="driver")):
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            first = ledger.enqueue(submit("a"))
            await trio.to_thread.run_sync(store.first_in.wait, 10)
            second = ledger.enqueue(submit("b"))
            store.release_first.set()
            with pytest.raises(LedgerBroken, match="the run ledger failed: RuntimeError"):
                await ledger.result(first)
    with pytest.raises(LedgerClosed, match="the run ledger is closed"):
        await ledger.result(second)
    assert store.applied == 1  # the batch behind it never reached the store
