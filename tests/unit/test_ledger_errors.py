"""The ledger's errors: every wait and every call raises an exception object of its own."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import outcome
import pytest
import trio
import trio.testing

from herdsman.runtime.ledger import Ledger, Queued, fresh_error, inline
from herdsman.runtime.store import MemoryStore, RunEnd, RunNotFound, RunStatus, Store, StoreError


async def on_loop(fn: Callable[[], Any]) -> Any:
    """Like ``inline`` but not it: the ledger queues calls for its writer task."""
    return fn()


def finish_unknown(store: Store) -> object:
    return store.finish("nope", RunEnd(RunStatus.FAILED), 1.0)


def fail(exc: BaseException) -> NoReturn:
    """Raise ``exc``: what a task is handling when it waits."""
    raise exc


@pytest.fixture
async def failed_call(nursery: trio.Nursery) -> tuple[Ledger, Queued[object]]:
    """A ledger whose writer runs, and a call of it that fails (an unknown run)."""
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    await nursery.start(ledger.run)
    return ledger, ledger.enqueue(finish_unknown)


async def wait_while_handling(
    ledger: Ledger, pending: Queued[object], handled: BaseException
) -> BaseException:
    """Wait for the failed ``pending`` while handling ``handled``; the error the wait raised."""
    try:
        fail(handled)
    except type(handled):
        with pytest.raises(StoreError) as caught:
            await ledger.result(pending)
    return caught.value


def frame_names(exc: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(exc.__traceback__)]


async def test_a_waiter_handling_its_error_never_sees_another_waits_frames_or_context(
    failed_call: tuple[Ledger, Queued[object]],
) -> None:
    ledger, pending = failed_call
    a_caught, b_done = trio.Event(), trio.Event()
    seen: dict[str, Any] = {}

    async def waiter_a() -> None:
        try:
            await ledger.result(pending)
        except StoreError as exc:
            before, context_before = frame_names(exc), exc.__context__
            a_caught.set()
            await b_done.wait()  # still handling it while B waits for the same call
            seen["a"] = (exc, before, frame_names(exc), context_before, exc.__context__)

    async def waiter_b() -> None:
        await a_caught.wait()
        seen["b"] = await wait_while_handling(ledger, pending, KeyError("B was handling this"))
        b_done.set()

    async with trio.open_nursery() as waiters:
        waiters.start_soon(waiter_a)
        waiters.start_soon(waiter_b)
    exc_a, before, after, context_before, context_after = seen["a"]
    assert exc_a is not seen["b"]
    assert type(exc_a) is type(seen["b"]) is RunNotFound
    assert str(exc_a) == str(seen["b"]) == "no run with id 'nope'"
    assert before == after
    assert before[0] == "waiter_a"
    assert context_before is None
    assert context_after is None
    # B's own copy carries what B was handling, as a raise there should.
    assert isinstance(seen["b"].__context__, KeyError)


async def test_a_later_wait_outside_a_handler_carries_no_context_from_an_earlier_wait(
    failed_call: tuple[Ledger, Queued[object]],
) -> None:
    ledger, pending = failed_call
    first = await wait_while_handling(
        ledger, pending, KeyError("handled during the first wait only")
    )
    assert isinstance(first.__context__, KeyError)
    try:
        await ledger.result(pending)
    except StoreError as exc:
        second = exc
    assert second.__context__ is None
    assert "handled during the first wait only" not in "".join(traceback.format_exception(second))


class BrokenStore(MemoryStore):
    """A store whose commit raises what no store should: not a StoreError."""

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        raise RuntimeError("driver blew up")


def stored_error(pending: Queued[Any]) -> BaseException:
    assert pending.committed
    assert pending.error is not None
    return pending.error


async def test_the_calls_of_a_batch_whose_writer_failed_get_an_error_each() -> None:
    ledger = Ledger(BrokenStore(), run_sync=on_loop)
    first = ledger.enqueue(lambda s: s.get("x"))
    second = ledger.enqueue(lambda s: s.get("y"))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ledger.run)
    except* RuntimeError:  # the writer dies of it, as designed
        pass
    assert stored_error(first) is not stored_error(second)
    assert str(stored_error(first)) == str(stored_error(second))
    assert str(stored_error(first)) == "the run ledger failed: RuntimeError('driver blew up')"


async def test_the_calls_left_queued_when_the_writer_stops_get_an_error_each() -> None:
    ledger = Ledger(MemoryStore(), run_sync=on_loop)
    queued = [ledger.enqueue(lambda s: s.get("x")), ledger.enqueue(lambda s: s.get("y"))]
    with trio.CancelScope() as scope:
        scope.cancel()
        # Cancelled at its first checkpoint, before it takes the queue.
        await ledger.run()
    errors = [stored_error(pending) for pending in queued]
    assert errors[0] is not errors[1]
    assert [str(error) for error in errors] == [
        "the run ledger is closed: the supervisor is stopping"
    ] * 2


def refuse(cause: BaseException, how: str) -> NoReturn:
    """Raise a StoreError after ``cause``: ``from`` it, ``from None``, or while handling it."""
    if how == "from":
        raise StoreError("the store refused") from cause
    try:
        fail(cause)
    except BaseException:
        if how == "from None":
            raise StoreError("the store refused") from None
        raise StoreError("the store refused")  # noqa: B904 - the context is what is tested


def raised_after(cause: BaseException, how: str) -> StoreError:
    try:
        refuse(cause, how)
    except StoreError as exc:
        exc.add_note("a note")
        return exc


def test_a_fresh_error_keeps_type_message_cause_context_notes_and_the_given_traceback() -> None:
    cause = OSError("disk full")
    seen: set[tuple[bool, bool, bool]] = set()
    for how in ("from", "from None", "while handling"):
        original = raised_after(cause, how)
        fresh = fresh_error(original, original.__traceback__)
        assert fresh is not original
        assert type(fresh) is StoreError
        assert fresh.args == original.args
        assert fresh.__cause__ is original.__cause__
        assert fresh.__context__ is original.__context__
        assert fresh.__suppress_context__ is original.__suppress_context__
        assert fresh.__traceback__ is original.__traceback__
        assert "".join(traceback.format_exception(fresh)) == "".join(
            traceback.format_exception(original)
        )
        assert fresh.__notes__ == ["a note"]
        fresh.add_note("only on the copy")
        assert original.__notes__ == ["a note"]
        seen.add(
            (original.__cause__ is None, original.__context__ is None, fresh.__suppress_context__)
        )
    # The three ways differ in what is copied.
    assert seen == {(False, True, True), (True, False, True), (True, False, False)}


class Picky(Exception):
    """An error whose constructor does not take its own args back."""

    def __init__(self, code: int, *, where: str) -> None:
        super().__init__(f"{where}: {code}")


def test_an_error_that_cannot_be_rebuilt_is_raised_itself() -> None:
    original = Picky(3, where="here")
    assert fresh_error(original, None) is original


class FailingCommitStore(MemoryStore):
    """A store whose commit fails as a SQL store's does when an undo failed."""

    def __init__(self) -> None:
        super().__init__()
        self.raised: list[StoreError] = []

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        error = StoreError("the batch was rolled back")
        error.__cause__ = RunNotFound("the call's own error")
        self.raised.append(error)
        raise error


async def test_a_failed_commit_reaches_each_caller_caused_by_the_stores_error() -> None:
    for run_sync in (on_loop, inline):
        store = FailingCommitStore()
        ledger = Ledger(store, run_sync=run_sync)
        errors: list[StoreError] = []
        async with trio.open_nursery() as nursery:
            if run_sync is on_loop:
                await nursery.start(ledger.run)
            for _ in range(2):
                try:
                    await ledger.call(lambda s: s.get("x"))
                except StoreError as exc:
                    errors.append(exc)
            nursery.cancel_scope.cancel()
        assert [str(exc) for exc in errors] == ["the batch was rolled back"] * 2
        assert [exc.__cause__ for exc in errors] == store.raised
        assert all(isinstance(exc.__cause__, StoreError) for exc in errors)
        assert all(isinstance(cause.__cause__, RunNotFound) for cause in store.raised)
        assert "the call's own error" in "".join(traceback.format_exception(errors[0]))
