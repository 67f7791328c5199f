"""The ledger writer: ordered callbacks, batching, and no hang when things fail."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import outcome
import pytest
import trio

from herdsman.runtime.ledger import Inline, Ledger, LedgerClosed, in_worker_thread, inline
from herdsman.runtime.store import (
    MemoryStore,
    NewRun,
    RunEnd,
    RunRecord,
    RunStatus,
    Store,
    StoreError,
)


def new(run_id: str) -> NewRun:
    return NewRun(id=run_id, provider="p", prompt="x")


def submit_at_1(run_id: str, store: Store) -> tuple[RunRecord, bool]:
    return store.submit(new(run_id), 1.0)


async def on_loop(fn: Callable[[], Any]) -> Any:
    """Like ``inline`` but not it: the ledger queues calls for its writer task."""
    return fn()


async def test_calls_queued_together_commit_as_one_batch_in_order(
    nursery: trio.Nursery,
) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    seen: list[str] = []
    results: dict[str, int] = {}

    async def submit(run_id: str) -> None:
        record, _ = await ledger.call(
            lambda s: s.submit(new(run_id), 1.0), then=lambda r: seen.append(r[0].id)
        )
        results[run_id] = record.seq

    async with trio.open_nursery() as callers:
        for run_id in ("a", "b", "c"):
            callers.start_soon(submit, run_id)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ledger.run)
    assert sorted(seen) == ["a", "b", "c"]
    # Callbacks follow the ledger's order, which is the order of the seqs.
    assert seen == sorted(seen, key=results.__getitem__)
    assert ledger.batches == 1


async def test_a_failing_callback_does_not_stop_the_writer(nursery: trio.Nursery) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    await nursery.start(ledger.run)

    def explode(_: object) -> None:
        raise RuntimeError("trace disk full")

    record, created = await ledger.call(lambda s: s.submit(new("a"), 1.0), then=explode)
    assert created
    assert record.id == "a"
    got = await ledger.call(lambda s: s.get("a"))
    assert got is not None


async def test_operation_errors_reach_only_their_caller(nursery: trio.Nursery) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    await nursery.start(ledger.run)
    with pytest.raises(StoreError):
        await ledger.call(lambda s: s.finish("nope", RunEnd(RunStatus.FAILED), 1.0))
    assert (await ledger.call(lambda s: s.submit(new("b"), 1.0)))[1] is True


async def test_a_stopped_ledger_fails_calls_instead_of_hanging() -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            scope.cancel()
    with pytest.raises(LedgerClosed, match="the run ledger is closed"):
        await ledger.call(lambda s: s.get("a"))
    # Queuing without waiting fails at once too, not at the wait.
    with pytest.raises(LedgerClosed, match="the run ledger is closed"):
        ledger.enqueue(lambda s: s.get("a"))


async def test_an_inline_ledger_applies_each_call_at_once_in_call_order() -> None:
    # No writer task runs here: an inline ledger must not need one.
    ledger = Ledger(MemoryStore(), run_sync=inline)
    seen: list[str] = []
    for run_id in ("a", "b"):
        record, created = await ledger.call(
            partial(submit_at_1, run_id), then=lambda r: seen.append(r[0].id)
        )
        # The callback ran before the call returned.
        assert created
        assert seen[-1] == record.id == run_id
    assert ledger.batches == 2
    with pytest.raises(StoreError):
        await ledger.call(
            lambda s: s.finish("nope", RunEnd(RunStatus.FAILED), 1.0),
            then=lambda r: seen.append(r.id),
        )
    assert seen == ["a", "b"]


async def test_an_inline_ledger_given_the_stores_apply_one_applies_each_call_by_it() -> None:
    store = MemoryStore()

    def refuse(*_: object, **__: object) -> list[outcome.Outcome[Any]]:
        raise AssertionError("apply() used: apply_one() does a call of its own")

    store.apply = refuse  # type: ignore[method-assign]
    ledger = Ledger(store, run_sync=Inline(store.apply_one))
    seen: list[object] = []
    record, created = await ledger.call(partial(submit_at_1, "a"), then=seen.append)
    assert created
    assert seen == [(record, True)]
    # A failed call: undone whole, its error raised at each wait with the
    # store's frames under the wait's, and its callback not run.
    pending = ledger.enqueue(
        lambda s: [s.submit(new("b"), 2.0), s.finish("nope", RunEnd(RunStatus.FAILED), 2.0)],
        then=seen.append,
    )
    assert ledger.committed(pending)
    frames = []
    for _ in range(2):
        with pytest.raises(StoreError, match="no run with id 'nope'") as caught:
            await ledger.result(pending)
        frames.append([frame.name for frame in traceback.extract_tb(caught.value.__traceback__)])
    assert frames[0] == frames[1]
    assert "finish" in frames[0]
    assert seen == [(record, True)]
    assert [r.id for r in store.list_runs()] == ["a"]
    assert ledger.batches == ledger.calls == 2


async def test_an_inline_ledger_not_given_apply_one_uses_the_stores_apply() -> None:
    # The ledger never picks apply_one by itself, whatever the store's type:
    # only whoever builds it, for a store it made, gives it one.
    store = MemoryStore()
    applied: list[int] = []
    honest = store.apply

    def counted(operations: Any, *, durable: bool = False) -> list[outcome.Outcome[Any]]:
        applied.append(len(operations))
        return honest(operations, durable=durable)

    store.apply = counted  # type: ignore[method-assign]
    ledger = Ledger(store, run_sync=inline)
    record, created = await ledger.call(partial(submit_at_1, "a"))
    assert created
    assert record.id == "a"
    assert applied == [1]


async def test_an_inline_ledger_over_a_subclass_of_the_in_memory_store_uses_its_apply() -> None:
    store = RecordingStore()
    ledger = Ledger(store, run_sync=inline)
    await ledger.call(partial(submit_at_1, "a"))
    assert store.applied == [(1, False)]


async def test_an_inline_ledger_over_a_closed_in_memory_store_fails_each_call() -> None:
    store = MemoryStore()
    ledger = Ledger(store, run_sync=inline)
    store.close()
    errors = []
    for _ in range(2):
        with pytest.raises(StoreError, match="the store is closed") as caught:
            await ledger.call(partial(submit_at_1, "a"))
        errors.append(caught.value)
    assert errors[0] is not errors[1]
    assert all(isinstance(error.__cause__, StoreError) for error in errors)


class RecordingStore(MemoryStore):
    """Remembers the size and durability of every batch it applies."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[tuple[int, bool]] = []

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        self.applied.append((len(operations), durable))
        return super().apply(operations, durable=durable)


async def test_calls_enqueued_without_a_checkpoint_commit_in_one_transaction(
    nursery: trio.Nursery,
) -> None:
    store = RecordingStore()
    ledger = Ledger(store, run_sync=on_loop)
    await nursery.start(ledger.run)
    await ledger.call(lambda s: s.submit(new("a"), 1.0))
    seen: list[str] = []
    # A finish, then a start queued behind it before anything is awaited:
    # the writer takes them together, one durable commit for both.
    finish = ledger.enqueue(lambda s: s.get("a"), then=lambda _: seen.append("first"))
    start = ledger.enqueue(
        lambda s: s.mark_running_many([("a", None)], 2.0),
        durable=True,
        then=lambda _: seen.append("second"),
    )
    assert store.applied == [(1, False)]  # nothing applied before the writer runs
    started = await ledger.result(start)
    assert [r.status for r in started] == [RunStatus.RUNNING]
    assert (await ledger.result(finish)) is not None
    assert store.applied == [(1, False), (2, True)]
    assert seen == ["first", "second"]


async def test_enqueue_on_an_inline_ledger_applies_at_once() -> None:
    store = RecordingStore()
    ledger = Ledger(store, run_sync=inline)
    pending = ledger.enqueue(lambda s: s.submit(new("a"), 1.0))
    assert store.applied == [(1, False)]
    record, created = await ledger.result(pending)
    assert created
    assert record.id == "a"


async def test_a_batch_in_a_worker_thread_returns_its_value_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    value, ran_in = await in_worker_thread(lambda: ("done", threading.get_ident()))
    assert value == "done"
    assert ran_in != loop_thread


async def test_a_batch_in_a_worker_thread_raises_what_the_batch_raised() -> None:
    def fail() -> None:
        raise StoreError("disk full")

    with pytest.raises(StoreError, match="disk full"):
        await in_worker_thread(fail)


async def test_a_batch_in_a_worker_thread_finishes_and_reports_even_when_cancelled() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def batch() -> str:
        started.set()
        release.wait(10)
        finished.append("committed")
        return "committed"

    got: list[str] = []
    with trio.CancelScope() as scope:

        async def cancel_once_running() -> None:
            await trio.to_thread.run_sync(started.wait, 10)
            scope.cancel()
            release.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_running)
            got.append(await in_worker_thread(batch))
            # The cancel lands at the next checkpoint, after the batch reported.
            await trio.lowlevel.checkpoint()
            got.append("not reached")
    assert scope.cancelled_caught
    assert finished == ["committed"]
    assert got == ["committed"]


async def test_waiting_for_a_call_already_committed_is_no_checkpoint(
    nursery: trio.Nursery,
) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    await nursery.start(ledger.run)
    finish = ledger.enqueue(lambda s: s.submit(new("a"), 1.0))
    start = ledger.enqueue(lambda s: s.get("a"))  # queued together: one batch
    await ledger.result(finish)
    # Its batch is committed: nothing to wait for, so not even a cancel stops it.
    with trio.CancelScope() as scope:
        scope.cancel()
        record = await ledger.result(start)
    assert not scope.cancelled_caught
    assert record is not None
    assert record.id == "a"
    assert ledger.batches == 1
    # One not yet committed is waited for, and a cancel stops the wait.
    later = ledger.enqueue(lambda s: s.get("a"))
    with trio.CancelScope() as scope:
        scope.cancel()
        await ledger.result(later)
    assert scope.cancelled_caught


class BrokenStore(MemoryStore):
    """A store whose commit raises what no store should: not a StoreError."""

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        raise RuntimeError("driver blew up")


async def test_a_batch_whose_store_raises_no_store_error_still_answers_its_callers() -> None:
    # The writer dies of it, but the callers of the batch in flight (some
    # wait shielded) must get an answer rather than wait forever.
    ledger = Ledger(BrokenStore(), run_sync=on_loop)
    answers: list[str] = []

    async def caller() -> None:
        # Shielded, as a finish is; bounded here so that a hang fails the test.
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            try:
                await ledger.call(lambda s: s.get("a"))
            except StoreError as exc:
                answers.append(str(exc))

    crashed: list[str] = []
    with trio.fail_after(5):
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(caller)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(ledger.run)
        except* RuntimeError as group:  # the writer: it does not carry on after this
            crashed.extend(str(exc) for exc in group.exceptions)
    assert crashed == ["driver blew up"]
    assert answers == ["the run ledger failed: RuntimeError('driver blew up')"]


async def test_a_call_waited_for_wakes_its_caller_and_one_never_waited_for_needs_no_event(
    nursery: trio.Nursery,
) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    finish = ledger.enqueue(lambda s: s.submit(new("a"), 1.0))
    start = ledger.enqueue(lambda s: s.get("a"))
    got: list[str] = []

    async def wait() -> None:
        record, _ = await ledger.result(finish)
        got.append(record.id)

    async with trio.open_nursery() as callers:
        callers.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert finish.done is not None  # made by the wait
        nursery.start_soon(ledger.run)
    assert got == ["a"]
    # Nobody waited for the start before it committed: it never needed an event.
    assert ledger.committed(start)
    assert start.done is None
    record = await ledger.result(start)
    assert record is not None


async def test_a_call_can_be_waited_for_by_several_tasks_and_again(
    nursery: trio.Nursery,
) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    pending = ledger.enqueue(lambda s: s.submit(new("a"), 1.0))
    got: list[tuple[RunRecord, bool]] = []

    async def wait() -> None:
        got.append(await ledger.result(pending))

    async with trio.open_nursery() as waiters:
        waiters.start_soon(wait)
        waiters.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(ledger.run)
    got.append(await ledger.result(pending))  # committed: at once
    assert len(got) == 3
    assert got[0][0].id == "a"
    assert got[0] is got[1] is got[2]


async def test_a_failed_call_raises_its_error_each_time_it_is_waited_for(
    nursery: trio.Nursery,
) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    await nursery.start(ledger.run)
    pending = ledger.enqueue(lambda s: s.finish("nope", RunEnd(RunStatus.FAILED), 1.0))
    raised: list[BaseException] = []
    frames: list[list[str]] = []
    for _ in range(3):
        try:
            await ledger.result(pending)
        except StoreError as exc:
            raised.append(exc)
            frames.append([frame.name for frame in traceback.extract_tb(exc.__traceback__)])
    assert len(raised) == 3
    # One exception object per wait (see test_ledger_errors.py), each the same error.
    assert {type(exc) for exc in raised} == {type(raised[0])}
    assert [str(exc) for exc in raised] == ["no run with id 'nope'"] * 3
    # Each time with the store's traceback under this wait, not grown by the
    # waits before it.
    assert frames[0] == frames[1] == frames[2]
    assert frames[0][0] == "test_a_failed_call_raises_its_error_each_time_it_is_waited_for"
    assert "finish" in frames[0]


async def test_a_settled_wait_is_not_stopped_by_a_cancel_which_lands_at_the_next_checkpoint(
    nursery: trio.Nursery,
) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    pending = ledger.enqueue(lambda s: s.submit(new("a"), 1.0))
    got: list[str] = []
    scope = trio.CancelScope()

    async def finish() -> None:
        with scope:
            record, _ = await ledger.settled(pending)
            got.append(record.id)  # reached although cancelled during the wait
            await trio.lowlevel.checkpoint()
            got.append("not reached")

    async with trio.open_nursery() as callers:
        callers.start_soon(finish)
        await trio.testing.wait_all_tasks_blocked()
        assert pending.waiter is not None
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # still waiting for the commit
        nursery.start_soon(ledger.run)
    assert got == ["a"]
    assert scope.cancelled_caught
    assert pending.waiter is None
    assert pending.done is None  # no event made for it


async def test_a_settled_wait_ends_when_the_ledger_closes() -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    errors: list[str] = []

    async def finish(pending: Any) -> None:
        try:
            await ledger.settled(pending)
        except StoreError as exc:
            errors.append(str(exc))

    with trio.fail_after(5):
        async with trio.open_nursery() as outer:
            with trio.CancelScope() as writer:
                async with trio.open_nursery() as nursery:
                    await nursery.start(ledger.run)
                    # Queued as the writer is cancelled: it never takes it.
                    writer.cancel()
                    outer.start_soon(finish, ledger.enqueue(lambda s: s.get("a")))
    assert errors == ["the run ledger is closed: the supervisor is stopping"]


async def test_committed_calls_need_no_settled_wait(nursery: trio.Nursery) -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    await nursery.start(ledger.run)
    finish = ledger.enqueue(lambda s: s.submit(new("a"), 1.0))
    start = ledger.enqueue(lambda s: s.get("a"))
    await ledger.settled(finish)
    with trio.CancelScope() as scope:
        scope.cancel()
        record = await ledger.settled(start)  # committed: no checkpoint at all
    assert not scope.cancelled_caught
    assert record is not None
