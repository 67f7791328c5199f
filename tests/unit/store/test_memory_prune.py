"""The in-memory store's prune: what a scan of every run deletes, read from a heap of ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from hypothesis import given, settings
from hypothesis import strategies as st
from test_memory_apply_one import calls, operation_of, times

from herdsman.runtime.store import MemoryStore, NewRun, RunEnd, RunRecord, RunStatus, Store


def every_run(store: MemoryStore) -> list[RunRecord]:
    return list(reversed(store.list_runs(limit=100_000)))  # seq order


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(calls, min_size=1, max_size=4), st.booleans(), st.none() | times),
        max_size=10,
    )
)
def test_prune_deletes_exactly_the_runs_that_ended_before_the_cutoff(
    steps: list[tuple[list[Callable[[Store], Any]], bool, float | None]],
) -> None:
    store = MemoryStore()
    for operation_steps, fail, cutoff in steps:
        # Operations that end, re-queue, note, recover, prune and fail (undone).
        store.apply([operation_of(operation_steps, fail)])
        if cutoff is None:
            continue
        before = every_run(store)
        doomed = [
            r.id
            for r in before
            if r.is_terminal and r.finished_at is not None and r.finished_at < cutoff
        ]
        assert store.prune(cutoff) == len(doomed)
        assert every_run(store) == [r for r in before if r.id not in doomed]


class NoScan(dict[str, RunRecord]):
    """The store's runs, refusing to be looked through."""

    def values(self) -> NoReturn:
        raise AssertionError("prune looked at every run")

    def items(self) -> NoReturn:
        raise AssertionError("prune looked at every run")

    def __iter__(self) -> NoReturn:
        raise AssertionError("prune looked at every run")


def test_a_prune_looks_only_at_the_runs_that_ended_before_its_cutoff() -> None:
    store = MemoryStore()
    for n in range(1000):
        run_id = f"r{n}"
        store.submit(NewRun(run_id, "p", "x"), float(n))
        store.mark_running(run_id, float(n), None)
        store.finish(run_id, RunEnd(RunStatus.SUCCEEDED), float(n) + 0.5)
    store.submit(NewRun("queued", "p", "x"), 2000.0)
    store._runs = NoScan(store._runs)
    # The simulator's hourly sweep, with every run younger than the cutoff:
    # nothing to delete, and nothing looked through to learn it.
    assert store.prune(0.0) == 0
    assert store.prune(10.0) == 10
    store._runs = dict(store._runs)
    assert [r.id for r in every_run(store)][:2] == ["r10", "r11"]
    assert len(every_run(store)) == 991


def test_an_end_a_failed_operation_gave_back_is_pruned_later() -> None:
    store = MemoryStore()
    store.submit(NewRun("a", "p", "x"), 1.0)
    store.mark_running("a", 1.0, None)
    store.finish("a", RunEnd(RunStatus.USAGE_LIMITED), 2.0)

    def requeue_prune_and_fail(s: Store) -> None:
        s.requeue("a")
        assert s.prune(10.0) == 0  # queued again: nothing to prune
        raise KeyError("undone")

    store.apply([requeue_prune_and_fail])
    assert store.get("a").status is RunStatus.USAGE_LIMITED  # type: ignore[union-attr]
    assert store.prune(10.0) == 1
    assert store.get("a") is None


def test_a_run_a_failed_operation_unpruned_is_pruned_later() -> None:
    store = MemoryStore()
    store.skip(NewRun("a", "p", "x"), 1.0, "busy")

    def prune_and_fail(s: Store) -> None:
        assert s.prune(10.0) == 1
        raise KeyError("undone")

    store.apply([prune_and_fail])
    assert store.get("a") is not None
    assert store.prune(10.0) == 1
    assert store.get("a") is None


def test_every_way_a_run_ends_is_pruned() -> None:
    store = MemoryStore()
    store.skip(NewRun("skipped", "p", "x"), 1.0, "busy")
    for run_id in ("finished", "noted", "lost"):
        store.submit(NewRun(run_id, "p", "x"), 1.0)
        store.mark_running(run_id, 1.0, None)
    store.finish("finished", RunEnd(RunStatus.SUCCEEDED), 2.0)
    store.finish("noted", RunEnd(RunStatus.FAILED), 2.0)
    store.submit(NewRun("cancelled", "p", "x"), 1.0)
    store.cancel_queued("cancelled", 3.0, "gone")
    store.recover(4.0)  # "lost"
    store.submit(NewRun("queued", "p", "x"), 1.0)
    # A note after the prune's heap has given up the end it replaced.
    assert store.prune(1.5) == 1  # "skipped"
    store.add_note("noted", "later")
    assert store.prune(2.5) == 2
    assert store.prune(3.5) == 1
    assert store.prune(4.5) == 1
    assert [r.id for r in every_run(store)] == ["queued"]
