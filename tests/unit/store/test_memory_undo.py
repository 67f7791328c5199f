"""The in-memory store's undo of a failed operation: the cases the shared contract cannot reach."""

from __future__ import annotations

import pytest

from herdsman.runtime.store import MemoryStore, NewRun, RunStatus, Store
from herdsman.runtime.store.undo import UndoLog


def new(run_id: str) -> NewRun:
    return NewRun(id=run_id, provider="p", prompt="x")


class Failed(Exception):
    """What the operations here raise after their changes."""


def test_an_apply_inside_an_operation_is_refused_and_the_operation_undone() -> None:
    store = MemoryStore()

    def outer(s: Store) -> None:
        s.submit(new("a"), 1.0)
        s.apply([lambda t: t.submit(new("b"), 1.0)])

    (result,) = store.apply([outer])
    # Refused as the SQL stores refuse it (see the store contract tests).
    with pytest.raises(RuntimeError, match="inside an operation of a batch"):
        result.unwrap()
    assert store.list_runs() == []
    # The seq the undone submit took is handed out again.
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
