"""The in-memory store's undo of a failed operation: the cases the shared contract cannot reach."""

from __future__ import annotations

import pytest

from herdsman.runtime.store import MemoryStore, NewRun, RunStatus, Store
from herdsman.runtime.store.undo import UndoLog


def new(run_id: str) -> NewRun:
    return NewRun(id=run_id, provider="p", prompt="x")


class Failed(Exception):
    """What the operations here raise after their changes."""


def test_an_apply_inside_an_operation_is_undone_with_it() -> None:
    store = MemoryStore()

    def outer(s: Store) -> None:
        s.submit(new("a"), 1.0)
        (inner,) = s.apply([lambda t: t.submit(new("b"), 1.0)])
        inner.unwrap()
        raise Failed

    (result,) = store.apply([outer])
    with pytest.raises(Failed):
        result.unwrap()
    assert store.list_runs() == []
    # The seqs the undone submits took are handed out again.
    record, _ = store.submit(new("c"), 2.0)
    assert record.seq == 1


def test_a_pruned_run_comes_back_in_its_place() -> None:
    store = MemoryStore()
    for run_id in "abc":
        store.submit(new(run_id), 1.0)
    store.cancel_queued("b", 2.0, "gone")
    before = store.list_runs()

    def prune_then_fail(s: Store) -> None:
        assert s.prune(3.0) == 1
        raise Failed

    store.apply([prune_then_fail])
    assert store.list_runs() == before
    assert [r.id for r in store.list_runs(status=RunStatus.CANCELLED)] == ["b"]
    assert store.counts()[RunStatus.CANCELLED] == 1


def test_an_undo_log_restores_keys_newest_first() -> None:
    mapping = {"kept": 1, "changed": 2}
    log = UndoLog()
    log.keep(mapping, "changed")
    mapping["changed"] = 3
    log.keep(mapping, "changed")
    mapping["changed"] = 4
    log.keep(mapping, "new")
    mapping["new"] = 5
    log.keep(mapping, "kept")
    del mapping["kept"]
    log.undo()
    assert mapping == {"changed": 2, "kept": 1}
    log.undo()  # emptied by the first
    assert mapping == {"changed": 2, "kept": 1}


def test_a_failed_apply_inside_an_operation_undoes_only_its_own_changes() -> None:
    store = MemoryStore()

    def outer(s: Store) -> None:
        s.submit(new("a"), 1.0)

        def inner(t: Store) -> None:
            t.submit(new("b"), 1.0)
            t.mark_running("a", 1.5, None)
            raise Failed

        (result,) = s.apply([inner])
        with pytest.raises(Failed):
            result.unwrap()
        s.submit(new("c"), 2.0)

    (result,) = store.apply([outer])
    result.unwrap()
    runs = {r.id: r for r in store.list_runs()}
    assert sorted(runs) == ["a", "c"]
    assert runs["a"].status is RunStatus.QUEUED  # the inner start is undone
    assert runs["c"].seq == 2  # b's seq was handed out again
    # What the outer operation kept is not undone by a later failed one.
    store.apply([lambda s: (s.submit(new("d"), 3.0), s.requeue("a"))])
    assert sorted(r.id for r in store.list_runs()) == ["a", "c"]


def test_an_undo_log_undoes_back_to_a_mark_only() -> None:
    mapping = {"x": 1}
    log = UndoLog()
    log.keep(mapping, "x")
    mapping["x"] = 2
    mark = log.mark()
    log.keep(mapping, "x")
    mapping["x"] = 3
    log.keep(mapping, "y")
    mapping["y"] = 4
    log.undo(mark)
    assert mapping == {"x": 2}
    log.undo(mark)  # those steps are gone: nothing more to undo there
    assert mapping == {"x": 2}
    log.clear()
    log.undo()  # cleared: the change before the mark stays
    assert mapping == {"x": 2}
