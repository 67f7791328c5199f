"""The ledger writer: every store call of the supervisor, in order, group-committed.

Calls are queued in the order they are made and applied by one writer task.
While a batch commits (in a worker thread: SQLite fsyncs), new calls pile up
and the next batch applies them all in one transaction, so under load one
commit — and one fsync when a batch holds a start — serves many calls.

Each call may carry a ``then`` callback. The writer runs the callbacks of a
batch synchronously, in queue order, right after the commit and before any
caller resumes. The supervisor updates the scheduler, the trace and the
metrics there, so they see changes in exactly the ledger's order — never in
the order trio happens to wake the callers.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Final, Generic, TypeVar

import outcome
import trio

from herdsman.runtime.store import Store, StoreError
from herdsman.runtime.store.errors import CommitOutcomeUnknown, ConnectionLost
from herdsman.runtime.store.memory import OperationFailed
from herdsman.runtime.thread_calls import ThreadCalls

log = logging.getLogger("herdsman.ledger")

T = TypeVar("T")
RunSync = Callable[[Callable[[], Any]], Awaitable[Any]]


async def in_worker_thread(fn: Callable[[], Any]) -> Any:
    """Run a blocking store batch off the event loop (the real store), uncancellably.

    Through :class:`~herdsman.runtime.thread_calls.ThreadCalls`, not
    ``trio.to_thread.run_sync``, which costs the event loop about three
    times as much per call (its capacity limiter, cancel scope and context
    copy: 70 against 24 µs a call here), and the ledger hops once per batch.
    Neither is needed: a ledger's one writer task has at most one batch in
    a thread at a time, and waits for it shielded anyway (a batch that
    reached the store must report). A batch once started runs to its end
    and reports; a cancel of the caller takes effect at its next checkpoint.
    """
    try:
        commits = _COMMITS.get()
    except LookupError:
        commits = ThreadCalls(
            _call, max_threads=COMMIT_THREADS, pool="ledger", name="herdsman ledger commit"
        )
        _COMMITS.set(commits)
    return await commits.call(fn)


def _call(fn: Callable[[], Any]) -> Any:
    return fn()


COMMIT_THREADS: Final = 8
"""Batches committed at once by the ledgers of one trio run (each ledger has one at a time)."""

_COMMITS: trio.lowlevel.RunVar[ThreadCalls[Callable[[], Any], Any]] = trio.lowlevel.RunVar(
    "herdsman_ledger_commits"
)


#: A store's way to apply one operation on its own (``MemoryStore.apply_one``).
ApplyOne = Callable[[Callable[[Store], Any]], Any]


class Inline:
    """Run a store batch on the event loop, as its call is made.

    For a store that never makes the caller wait (the in-memory one of the
    simulator, where a thread would let the fake clock jump while it
    runs). A ledger given this applies each call at once, in the caller's
    task: with nothing to wait for there is nothing to batch, and the hop
    through the writer task would only cost two scheduling rounds per call.

    ``apply_one``, if given, applies each call instead of the store's
    ``apply`` of a batch of one: the operation's value as it is, its error
    wrapped in :class:`~herdsman.runtime.store.memory.OperationFailed`, and
    a refusal of the whole call raised as ``apply`` raises it. Whoever
    builds the ledger gives it for the store it made
    (``MemoryStore.apply_one``, the replay's): no batch list and no
    outcome object for each of a run's three calls, 27,600 instructions a
    replayed run (677,188 without it, 649,544 with it: 4%; docs/simulator.md,
    "Production without simulator special cases").
    """

    def __init__(self, apply_one: ApplyOne | None = None) -> None:
        self.apply_one = apply_one

    async def __call__(self, fn: Callable[[], Any]) -> Any:
        return fn()


#: Store batches run on the event loop, through the store's ``apply``.
inline: Final = Inline()


class Queued(Generic[T]):
    """A store call in the ledger's queue (see :meth:`Ledger.enqueue`).

    Once applied (or refused), ``committed`` is true and the call has its
    ``value`` or, if it failed, its ``error`` (``None`` otherwise): held as
    they are rather than as an ``outcome.Outcome``, whose construction cost
    more than the rest of an inline call's hand-over.
    ``done`` is made only when someone waits for a call not yet committed:
    a run's start usually commits with its finish and is never waited for.
    ``traceback`` is a failed call's error's traceback as the store call left
    it: each wait raises a copy of the error from there (see :func:`fresh_error`).
    ``waiter`` is the task waiting in :meth:`Ledger.settled`, if one is.
    """

    __slots__ = (
        "committed",
        "done",
        "durable",
        "error",
        "operation",
        "then",
        "traceback",
        "value",
        "waiter",
    )

    def __init__(
        self,
        operation: Callable[[Store], T],
        durable: bool,
        then: Callable[[T], None] | None,
    ) -> None:
        self.operation = operation
        self.durable = durable
        self.then = then
        self.committed = False
        self.value: T | None = None
        self.error: BaseException | None = None
        self.done: trio.Event | None = None
        self.traceback: TracebackType | None = None
        self.waiter: trio.lowlevel.Task | None = None

    def wake(self) -> None:
        """Wake whoever waits for this call: it has its result."""
        if self.done is not None:
            self.done.set()
        if self.waiter is not None:
            trio.lowlevel.reschedule(self.waiter)
            self.waiter = None


class LedgerClosed(StoreError):
    """The ledger no longer applies calls: its writer ended, as the supervisor stops.

    Nothing of the call was applied, and asking again will not help until the
    supervisor runs again: unlike a plain :class:`StoreError` (a locked or
    full disk) this is not a passing failure.
    """


CLOSED = "the run ledger is closed: the supervisor is stopping"


class LedgerBroken(StoreError):
    """A batch failed with an error that is not a store failure: a bug, not an outage.

    Its callers get this (a :class:`StoreError`, so they handle it as any
    failed write); the writer dies of the original error, which closes the
    ledger. Whether the batch was kept is unknown.
    """


def _cannot_abort(_: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
    return trio.lowlevel.Abort.FAILED


def _unwrap(pending: Queued[T]) -> T:
    """A committed call's value, or its error raised again."""
    error = pending.error
    if error is None:
        return pending.value  # type: ignore[return-value]  # committed: its value
    # Not the error itself: a copy of it for each wait, with the store's
    # traceback, not one grown by earlier waits' frames.
    raise fresh_error(error, pending.traceback)


class Ledger:
    """Serialises and batches store calls; see the module docstring."""

    def __init__(self, store: Store, *, run_sync: RunSync = in_worker_thread) -> None:
        self.store = store
        self._run_sync = run_sync
        #: Whether each call is applied as it is made, in the caller's task,
        #: never queued behind a commit (given :class:`Inline`): a call is
        #: then committed before :meth:`enqueue` returns.
        self.applies_at_once = isinstance(run_sync, Inline)
        self._apply_one = run_sync.apply_one if isinstance(run_sync, Inline) else None
        self._queue: list[Queued[Any]] = []
        self._work = trio.Event()
        self._closed = False
        self.batches = 0
        self.calls = 0

    async def call(
        self,
        operation: Callable[[Store], T],
        *,
        durable: bool = False,
        then: Callable[[T], None] | None = None,
    ) -> T:
        """Queue ``operation(store)``; return its result once committed.

        ``durable`` makes the commit reach the disk before this returns.
        ``then(result)`` runs in ledger order right after the commit, only if
        the operation succeeded. If the caller is cancelled while waiting, the
        call still happens (it was queued), callbacks included.
        """
        return await self.result(self.enqueue(operation, durable=durable, then=then))

    def enqueue(
        self,
        operation: Callable[[Store], T],
        *,
        durable: bool = False,
        then: Callable[[T], None] | None = None,
    ) -> Queued[T]:
        """Queue ``operation(store)`` now, without waiting; :meth:`result` waits.

        As :meth:`call`, in two steps. Calls queued with no checkpoint between
        them are taken by the writer together, so they commit in one
        transaction, in queue order: all of them or none.
        """
        if self._closed:
            raise LedgerClosed(CLOSED)
        if self.applies_at_once:
            # Nothing can be queued ahead of it: the store never makes the
            # writer wait, so every earlier call has been applied already.
            pending = Queued(operation, durable, then)
            self._apply_now(pending)
        else:
            pending = Queued(operation, durable, then)
            self._queue.append(pending)
            self._work.set()
        return pending

    def committed(self, pending: Queued[T]) -> bool:
        """Whether ``pending`` has been applied (or refused): :meth:`result` will not wait."""
        return pending.committed

    async def result(self, pending: Queued[T]) -> T:
        """Wait until ``pending`` (from :meth:`enqueue`) is committed; its result.

        A call already committed (a start that shared its batch with the
        finish just waited for, say) returns at once, with no checkpoint: a
        trip through the scheduler per run for nothing to wait for. Any
        number of tasks may wait for one call, any number of times: each
        gets its value, or its error raised again — as an exception object
        of its own (:func:`fresh_error`), so one waiter's raise never changes
        the traceback or context of the error another waiter is handling.
        """
        if not pending.committed:
            if pending.done is None:
                pending.done = trio.Event()
            await pending.done.wait()
        return _unwrap(pending)

    async def settled(self, pending: Queued[T]) -> T:
        """As :meth:`result`, but the wait cannot be cancelled; one such waiter per call.

        For a caller that must learn the outcome even when cancelled (a
        run's task recording its finish during a forced shutdown), at the
        cost of one scheduling round: a shielded cancel scope around
        :meth:`result` does the same, but entering and leaving one cost
        the event loop more than the rest of a run's bookkeeping on its
        finish. A cancel that arrives meanwhile takes effect at the
        caller's next checkpoint.
        """
        if not pending.committed:
            assert pending.waiter is None, "one settled() waiter per call"
            pending.waiter = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(_cannot_abort)
        return _unwrap(pending)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task: apply queued calls batch by batch, forever."""
        task_status.started()
        try:
            while True:
                await self._work.wait()
                self._work = trio.Event()
                batch, self._queue = self._queue, []
                # Shielded: a batch that reached the store must finish and report,
                # or its callers (and their ``then``) would never learn the outcome.
                with trio.CancelScope(shield=True):
                    await self._apply(batch)
        finally:
            # Nobody will apply what is still queued: fail it rather than let
            # its callers wait forever.
            self._closed = True
            for pending in self._queue:
                # One exception object per call, as a failed commit's callers get.
                pending.error = LedgerClosed(CLOSED)
                pending.committed = True
                pending.wake()
            self._queue = []

    async def _apply(self, batch: Sequence[Queued[Any]]) -> None:
        try:
            results: list[outcome.Outcome[Any]] = await self._run_sync(partial(self._commit, batch))
        except BaseException as exc:
            # Not a StoreError (MemoryError, an unmapped driver error): the
            # writer dies, but this batch's callers (shielded, some) must learn it.
            failed = f"the run ledger failed: {exc!r}"
            self._settle(batch, [outcome.Error(LedgerBroken(failed)) for _ in batch])
            raise
        self._settle(batch, results)

    def _apply_now(self, pending: Queued[Any]) -> None:
        """:meth:`_commit` and :meth:`_settle` for a batch of one, in the caller's task.

        Through the ``apply_one`` the ledger's :class:`Inline` was given, if
        any: then without an outcome to build and read for a value.
        """
        self.batches += 1
        self.calls += 1
        apply_one = self._apply_one
        if apply_one is None:
            try:
                (result,) = self.store.apply([pending.operation], durable=pending.durable)
            except StoreError as exc:  # the commit itself failed: nothing of it was kept
                result = outcome.Error(_commit_failed(exc))
            self._hand_over(pending, result)
            return
        try:
            value = apply_one(pending.operation)
        except OperationFailed as failed:  # the call failed, and was undone
            self._hand_over(pending, outcome.Error(failed.error))
            return
        except StoreError as exc:  # the commit itself failed: nothing of it was kept
            self._hand_over(pending, outcome.Error(_commit_failed(exc)))
            return
        pending.value = value
        pending.committed = True
        then = pending.then
        if then is not None:
            try:
                then(value)
            except Exception:
                log.exception("error after a ledger commit; carrying on")

    def _commit(self, batch: Sequence[Queued[Any]]) -> list[outcome.Outcome[Any]]:
        self.batches += 1
        self.calls += len(batch)
        durable = any(c.durable for c in batch)
        try:
            return self.store.apply([c.operation for c in batch], durable=durable)
        except StoreError as exc:  # the commit itself failed: nothing of it was kept
            # One exception object per caller: each re-raises it in its own task.
            return [outcome.Error(_commit_failed(exc)) for _ in batch]

    def _settle(self, batch: Sequence[Queued[Any]], results: list[outcome.Outcome[Any]]) -> None:
        """Hand each call its result and run the callbacks, in queue order."""
        try:
            for pending, result in zip(batch, results, strict=True):
                self._hand_over(pending, result)
        finally:
            for pending in batch:
                pending.wake()

    def _hand_over(self, pending: Queued[Any], result: outcome.Outcome[Any]) -> None:
        """Give one call its result and run its callback."""
        # One type check on the usual path, a value: an outcome is a Value or an Error.
        if isinstance(result, outcome.Value):
            pending.value = result.value
            pending.committed = True
            if pending.then is not None:
                try:
                    pending.then(result.value)
                except Exception:
                    # A failing callback (a trace write on a full disk, say)
                    # must not take the writer, and every later call, down.
                    log.exception("error after a ledger commit; carrying on")
        else:
            assert isinstance(result, outcome.Error)
            pending.error = result.error
            pending.traceback = result.error.__traceback__
            pending.committed = True


def _commit_failed(exc: StoreError) -> StoreError:
    """One caller's error for a commit that failed with ``exc``, caused by it.

    Of the class that tells the caller what the failure means (a commit
    whose outcome is unknown, a lost connection, or a plain
    :class:`StoreError`), as ``raise ... from exc`` would make it: the chain
    keeps what the store said caused the failure (a call whose undo failed,
    a driver error), which is only ever read, never raised again, so every
    caller may share it.
    """
    kind = next(k for k in _COMMIT_FAILURES if isinstance(exc, k))
    error = kind(str(exc))
    error.__cause__ = exc
    error.__suppress_context__ = True
    return error


#: The classes a failed commit's callers see, the most telling first.
_COMMIT_FAILURES: Final = (CommitOutcomeUnknown, ConnectionLost, StoreError)


def fresh_error(error: BaseException, traceback: TracebackType | None) -> BaseException:
    """A new exception like ``error`` for one raise, with ``traceback`` as its traceback.

    Raising an exception object changes it: its ``__traceback__`` grows by
    the raising frames and its ``__context__`` becomes whatever the raising
    task is handling. A failed call may be waited for by several tasks, so
    each wait raises its own copy: same type, arguments (so same message),
    ``__cause__``, ``__context__``, ``__suppress_context__`` and notes (a
    list of its own). An error whose class cannot be rebuilt from its
    arguments (a constructor with other parameters) is raised itself, as
    before copies: sharing it is better than hiding it behind a copy error.
    """
    try:
        fresh = copy.copy(error)
    except Exception:
        return error.with_traceback(traceback)
    fresh.__cause__ = error.__cause__
    fresh.__context__ = error.__context__
    fresh.__suppress_context__ = error.__suppress_context__
    notes = getattr(error, "__notes__", None)
    if isinstance(notes, list):
        fresh.__notes__ = list(notes)
    return fresh.with_traceback(traceback)
