"""``MemoryStore.apply_one``: what ``apply([operation])`` does, without the list and outcome.

The simulator's inline ledger applies every call through it, so it must
answer and change the ledger exactly as ``apply`` does, failures included.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from outcome import Error, Value

from herdsman.runtime.store import MemoryStore, NewRun, RunEnd, RunStatus, Store, StoreError
from herdsman.runtime.store.memory import OperationFailed

run_ids = st.sampled_from(["a", "b", "c"])
times = st.sampled_from([0.0, 1.0, 2.5, 7.0])
texts = st.none() | st.sampled_from(["", "x", "é", "\0", "\ud800"])
accounts = st.none() | st.sampled_from(["", "a", "b"])

# Every kind of change a call of an operation may make, legal or not.
calls: st.SearchStrategy[Callable[[Store], Any]] = st.one_of(
    st.builds(
        lambda r, n, t: lambda s: s.submit(NewRun(r, "p", "x", conversation=t), n),
        run_ids,
        times,
        texts,
    ),
    st.builds(lambda r, n: lambda s: s.skip(NewRun(r, "p", "x"), n, "busy"), run_ids, times),
    st.builds(lambda r, n, a: lambda s: s.mark_running(r, n, a), run_ids, times, texts),
    st.builds(
        lambda items, n: lambda s: s.mark_running_many(items, n),
        st.lists(st.tuples(run_ids, accounts), max_size=3),
        times,
    ),
    st.builds(
        lambda r, status, n, t: lambda s: s.finish(r, RunEnd(status, exit_code=0, reason=t), n),
        run_ids,
        st.sampled_from(RunStatus),
        times,
        texts,
    ),
    st.builds(lambda r, n: lambda s: s.cancel_queued(r, n, "gone"), run_ids, times),
    st.builds(lambda r: lambda s: s.requeue(r), run_ids),
    st.builds(lambda r, t: lambda s: s.add_note(r, t or "-"), run_ids, texts),
    st.builds(lambda n: lambda s: s.recover(n), times),
    st.builds(lambda n: lambda s: s.prune(n), times),
    st.builds(
        lambda c, sid: lambda s: s.set_conversation_session("p", "default", c, sid, None),
        st.sampled_from(["c1", "c2"]),
        texts,
    ),
    st.builds(
        lambda a, n, t: lambda s: s.set_account_limit("p", a, n, t or "-"), accounts, times, texts
    ),
    st.builds(lambda a: lambda s: s.clear_account_limit("p", a), accounts),
    st.just(lambda s: s.apply([lambda t: t.get("a")])),  # refused: nested
    st.just(lambda s: s.apply_one(lambda t: t.get("a"))),  # refused: nested
)


def answer(call: Callable[[Store], Any], store: Store) -> tuple[str, Any]:
    try:
        return ("ok", call(store))
    except Exception as exc:
        return ("error", (type(exc), str(exc)))


def operation_of(steps: list[Callable[[Store], Any]], fail: bool) -> Callable[[Store], Any]:
    def operation(store: Store) -> list[tuple[str, Any]]:
        done = [answer(step, store) for step in steps]
        if fail:
            raise KeyError("the operation failed after its calls")
        return done

    return operation


def state(store: MemoryStore) -> tuple[Any, ...]:
    return (
        store.list_runs(limit=1000),
        store.queued_in_order(),
        dict(store.counts()),
        store.sessions(),
        store.account_limits(-1.0),
        store.account_usage(0.0),
        store._last_seq,
    )


def applied(store: MemoryStore, operation: Callable[[Store], Any]) -> tuple[str, Any]:
    (result,) = store.apply([operation])
    if isinstance(result, Value):
        return ("ok", result.value)
    assert isinstance(result, Error)
    return ("error", (type(result.error), str(result.error)))


def applied_one(store: MemoryStore, operation: Callable[[Store], Any]) -> tuple[str, Any]:
    try:
        return ("ok", store.apply_one(operation))
    except OperationFailed as failed:
        return ("error", (type(failed.error), str(failed.error)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(calls, min_size=1, max_size=4), st.booleans()), max_size=8))
def test_apply_one_answers_and_changes_the_ledger_as_apply_of_one(
    operations: list[tuple[list[Callable[[Store], Any]], bool]],
) -> None:
    by_apply, by_apply_one = MemoryStore(), MemoryStore()
    for steps, fail in operations:
        operation = operation_of(steps, fail)
        assert applied_one(by_apply_one, operation) == applied(by_apply, operation)
        assert state(by_apply_one) == state(by_apply)


def test_an_operations_error_is_raised_wrapped_with_its_own_traceback_and_undone() -> None:
    store = MemoryStore()

    def submit_then_fail(s: Store) -> None:
        s.submit(NewRun("a", "p", "x"), 1.0)
        s.finish("nope", RunEnd(RunStatus.FAILED), 2.0)

    with pytest.raises(OperationFailed) as caught:
        store.apply_one(submit_then_fail)
    error = caught.value.error
    assert str(error) == "no run with id 'nope'"
    # Its traceback reaches into the operation, as apply's outcome.Error's does.
    assert "submit_then_fail" in [
        frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)
    ]
    assert store.list_runs() == []
    assert store.submit(NewRun("b", "p", "x"), 3.0)[0].seq == 1  # its seq handed out again


def test_a_closed_store_refuses_apply_one_as_it_refuses_apply() -> None:
    store = MemoryStore()
    store.close()
    with pytest.raises(StoreError, match="the store is closed"):
        store.apply([lambda s: None])
    with pytest.raises(StoreError, match="the store is closed"):
        store.apply_one(lambda s: None)


def test_apply_one_inside_an_operation_is_refused_as_apply_is() -> None:
    store = MemoryStore()
    refused: list[BaseException] = []

    def outer(s: Store) -> None:
        s.submit(NewRun("a", "p", "x"), 1.0)
        try:
            store.apply_one(lambda t: t.submit(NewRun("b", "p", "x"), 1.0))
        except RuntimeError as exc:  # raised as it is, not as the inner call's error
            refused.append(exc)
            raise

    with pytest.raises(OperationFailed) as caught:
        store.apply_one(outer)
    assert caught.value.error is refused[0]
    assert "inside an operation of a batch" in str(refused[0])
    assert store.list_runs() == []
