"""The in-memory store the simulator uses: the SQLite store's semantics, without SQLite.

The simulator runs under pyfakefs, where SQLite cannot work (it is not
faked), and must be fast. The shared contract tests and a differential
property test keep this store behaving exactly like :class:`SqliteStore`,
errors and ordering included.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from heapq import heappop, heappush
from math import isfinite
from typing import TYPE_CHECKING, Any, Final

import outcome

from herdsman.runtime.store.errors import StoreError, nested_apply
from herdsman.runtime.store.records import (
    LOST_ON_RESTART,
    AccountLimit,
    AccountUse,
    Attempt,
    NewRun,
    RunEnd,
    RunRecord,
    RunStatus,
    Session,
    attempt_of,
    budget_charge,
    check_limit,
    check_limit_text,
    check_now,
    check_text,
    ended,
    finished,
    is_terminal,
    needs_before,
    new_record,
    not_found,
    not_queued,
    noted,
    requeued,
    session_before,
    started,
)
from herdsman.runtime.store.undo import UndoLog
from herdsman.runtime.store.usage import SpentAttempt, UsageBy, UsageTotal, usage_totals

if TYPE_CHECKING:
    from herdsman.runtime.store.base import Store


# Read once: a member read as an attribute of its enum class costs a
# Python-level call, since the enum's metaclass defines __getattr__.
_QUEUED: Final = RunStatus.QUEUED


class OperationFailed(Exception):
    """The operation :meth:`MemoryStore.apply_one` ran raised ``error``; it was undone whole.

    Raised for the operation's error so that the caller can tell it from an
    error of ``apply`` itself (a closed store), which ``apply_one`` raises as
    it is, as ``apply`` does.
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class MemoryStore:
    """A :class:`~herdsman.runtime.store.base.Store` held in dicts.

    Point operations are O(1); listings, ``counts``, ``recover`` and
    ``prune`` scan every run, which is fine at simulator sizes and keeps
    this store obviously right. Nothing is durable, which is the point.
    """

    def __init__(self) -> None:
        # Insertion order is seq order: a run is inserted once, with the next
        # seq, and never re-inserted (prune only deletes).
        self._runs: dict[str, RunRecord] = {}
        self._sessions: dict[tuple[str, str, str], Session] = {}
        self._limits: dict[tuple[str, str | None], AccountLimit] = {}
        # The earlier attempts of runs that went back to the queue, by run id.
        self._attempts: dict[str, tuple[Attempt, ...]] = {}
        self._last_seq = 0
        # (finished_at, run id) of every record put with an end, a heap:
        # what prune looks at. Every run whose record has an end has an
        # entry for that end (_ended); entries of records replaced or
        # deleted since stay until prune reaches them (see prune).
        self._ends: list[tuple[float, str]] = []
        self._closed = False
        # How to undo what the operations applying now changed; self._undo
        # is this log while an operation runs, None otherwise (nothing logged).
        self._log = UndoLog()
        self._undo: UndoLog | None = None

    def submit(self, new: NewRun, now: float) -> tuple[RunRecord, bool]:
        """See :meth:`Store.submit`."""
        return self._create(new, now, _QUEUED, None)

    def skip(self, new: NewRun, now: float, reason: str) -> tuple[RunRecord, bool]:
        """See :meth:`Store.skip`."""
        return self._create(new, now, RunStatus.SKIPPED, reason)

    def _create(
        self, new: NewRun, now: float, status: RunStatus, reason: str | None
    ) -> tuple[RunRecord, bool]:
        # The checks of _check_open and check_now without their calls when
        # they pass (here, in mark_running_many and in finish: every run's
        # submit, start and finish in the simulator).
        if self._closed:
            self._check_open()
        if now.__class__ is not float or not isfinite(now):
            now = check_now(now)
        existing = self._runs.get(new.id)
        if existing is not None:
            return existing, False
        record = new_record(new, self._last_seq + 1, now, status, reason)
        self._last_seq += 1
        self._put(record)
        if status is not _QUEUED:  # skipped: it ends as it is made
            self._ended(record)
        return record, True

    def mark_running(self, run_id: str, now: float, account: str | None) -> RunRecord:
        """See :meth:`Store.mark_running`."""
        return self.mark_running_many([(run_id, account)], now)[0]

    def mark_running_many(
        self, items: Sequence[tuple[str, str | None]], now: float
    ) -> list[RunRecord]:
        """See :meth:`Store.mark_running_many`."""
        if self._closed:  # as in _create
            self._check_open()
        if now.__class__ is not float or not isfinite(now):
            now = check_now(now)
        if len(items) == 1:  # the usual start: nothing to stage
            ((run_id, account),) = items
            current = self._runs.get(run_id)
            if current is None:
                raise not_found(run_id)
            record = started(current, now, account)
            self._put(record)
            return [record]
        # Stage every change first so an illegal item leaves nothing applied,
        # like the rolled-back transaction of the SQLite store. A run given
        # twice fails its second start (running cannot become running), so
        # the staged records are the items' records, in their order.
        staged: dict[str, RunRecord] = {}
        for run_id, account in items:
            current = staged.get(run_id) or self._runs.get(run_id)
            if current is None:
                raise not_found(run_id)
            staged[run_id] = started(current, now, account)
        for record in staged.values():
            self._put(record)
        return list(staged.values())

    def finish(self, run_id: str, end: RunEnd, now: float) -> RunRecord:
        """See :meth:`Store.finish`."""
        if self._closed:  # as in _create
            self._check_open()
        if now.__class__ is not float or not isfinite(now):
            now = check_now(now)
        current = self._runs.get(run_id)
        if current is None:
            raise not_found(run_id)
        before = (
            session_before(self._runs.values(), current, end, self._attempts.get(run_id, ()))
            if end.usage is not None and needs_before(end)
            else None
        )
        record = finished(current, end, now, before)
        self._put(record)
        heappush(self._ends, (now, run_id))  # _ended's step, from what is at hand
        return record

    def cancel_queued(self, run_id: str, now: float, reason: str) -> RunRecord:
        """See :meth:`Store.cancel_queued`."""
        self._check_open()
        now = check_now(now)
        current = self._existing(run_id)
        if current.status is not RunStatus.QUEUED:
            raise not_queued(current)
        record = ended(current, RunStatus.CANCELLED, now, reason)
        self._put(record)
        self._ended(record)
        return record

    def add_note(self, run_id: str, note: str) -> RunRecord:
        """See :meth:`Store.add_note`."""
        self._check_open()
        record = noted(self._existing(run_id), note)
        self._put(record)
        self._ended(record)  # a note keeps the end a record has
        return record

    def requeue(
        self, run_id: str, *, failure: str | None = None, retry_at: float | None = None
    ) -> RunRecord:
        """See :meth:`Store.requeue`."""
        self._check_open()
        current = self._existing(run_id)
        record = requeued(current)
        self._keep_attempt(current, failure, retry_at)
        self._put(record)
        return record

    def _keep_attempt(
        self,
        current: RunRecord,
        failure: str | None,
        retry_at: float | None,
        held_by: str | None = None,
    ) -> None:
        """Keep the attempt ``current`` holds before a re-queue clears it (undone with its call)."""
        attempts = self._attempts
        if self._undo is not None:
            self._undo.keep(attempts, current.id)
        attempts[current.id] = (
            *attempts.get(current.id, ()),
            attempt_of(current, failure, retry_at, held_by),
        )

    def attempts(self, run_id: str) -> list[Attempt]:
        """See :meth:`Store.attempts`."""
        self._check_open()
        return list(self._attempts.get(run_id, ()))

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        """See :meth:`Store.apply`. An operation that raises is undone whole."""
        self._check_open()
        if self._undo is not None:  # inside an operation: refused as the SQL stores refuse it
            raise nested_apply()
        if len(operations) == 1:  # the inline ledger's every call: no comprehension to run
            return [outcome.capture(self._operation, operations[0])]
        return [outcome.capture(self._operation, operation) for operation in operations]

    def apply_one(self, operation: Callable[[Store], Any]) -> Any:
        """``apply([operation])`` for the simulator's inline ledger, without its list and outcome.

        Returns the operation's value; if it raises, its changes are undone
        and :class:`OperationFailed` is raised with its error (as ``apply``
        would have returned it, an ``outcome.Error``). What ``apply`` itself
        raises (a closed store, a call from inside an operation) is raised as
        it is. Building an outcome per call cost the simulator more than
        the rest of handing the call over.
        """
        if self._closed:
            self._check_open()
        if self._undo is not None:  # inside an operation: refused as the SQL stores refuse it
            raise nested_apply()
        try:
            return self._operation(operation)
        except BaseException as exc:
            # Told apart from a refusal of the whole call (above), raised as it is.
            raise OperationFailed(exc) from None

    def _operation(self, operation: Callable[[Store], Any]) -> Any:
        """Run one operation of a batch; if it raises, undo every change it made.

        Every operation logs into the store's one log, cleared when the
        operation ends: no log is built per operation (the simulator applies
        three a run). Never nested: apply refuses to run inside an operation.
        """
        log = self._undo = self._log
        try:
            return operation(self)
        except BaseException:
            self._undo = None  # the undo itself is not logged
            log.undo()
            raise
        finally:
            self._undo = None
            log.clear()

    def get(self, run_id: str) -> RunRecord | None:
        """See :meth:`Store.get`."""
        self._check_open()
        return self._runs.get(run_id)

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        provider: str | None = None,
        conversation: str | None = None,
        workspace: str | None = None,
        limit: int = 100,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[RunRecord]:
        """See :meth:`Store.list_runs`."""
        self._check_open()
        check_limit(limit)
        out: list[RunRecord] = []
        if limit == 0:
            return out
        for record in reversed(self._runs.values()):
            if (
                (status is None or record.status is status)
                and (provider is None or record.provider == provider)
                and (conversation is None or record.conversation == conversation)
                and (workspace is None or record.workspace == workspace)
                and (after_seq is None or record.seq > after_seq)
                and (before_seq is None or record.seq < before_seq)
            ):
                out.append(record)
                if len(out) == limit:
                    break
        return out

    def queued_in_order(self) -> list[RunRecord]:
        """See :meth:`Store.queued_in_order`."""
        self._check_open()
        return [r for r in self._runs.values() if r.status is RunStatus.QUEUED]

    def recover(self, now: float) -> list[RunRecord]:
        """See :meth:`Store.recover`."""
        self._check_open()
        now = check_now(now)
        found = [
            ended(r, RunStatus.LOST, now, LOST_ON_RESTART)
            for r in self._runs.values()
            if r.status is RunStatus.RUNNING
        ]
        for record in found:
            self._put(record)
            self._ended(record)
        return found

    def prune(self, finished_before: float) -> int:
        """See :meth:`Store.prune`."""
        self._check_open()
        finished_before = check_now(finished_before)
        # Only the runs that ended before the cutoff, oldest end first, from
        # the heap of ends: not a scan of every run, which the simulator's
        # hourly sweeps made cost more the more runs it had replayed.
        ends, runs = self._ends, self._runs
        doomed: list[RunRecord] = []
        while ends and ends[0][0] < finished_before:
            _, run_id = heappop(ends)
            # An end may be of a record since replaced (its run re-queued or
            # noted, say) or deleted: the run's record as it is decides.
            record = runs.get(run_id)
            if (
                record is not None
                and is_terminal(record.status)
                and record.finished_at is not None
                and record.finished_at < finished_before
            ):
                del runs[run_id]
                doomed.append(record)
        attempts = self._attempts
        for record in doomed:
            if record.id in attempts:
                if self._undo is not None:
                    self._undo.keep(attempts, record.id)
                del attempts[record.id]
        if doomed and self._undo is not None:
            self._undo.append((self._unprune, doomed))
        return len(doomed)

    def conversation_session(
        self, provider: str, workspace: str, conversation: str
    ) -> Session | None:
        """See :meth:`Store.conversation_session`."""
        self._check_open()
        return self._sessions.get((provider, workspace, conversation))

    def set_conversation_session(
        self,
        provider: str,
        workspace: str,
        conversation: str,
        session_id: str | None,
        account: str | None = None,
    ) -> None:
        """See :meth:`Store.set_conversation_session`."""
        self._check_open()
        check_text(
            conversation,
            provider=provider,
            workspace=workspace,
            conversation=conversation,
            session_id=session_id,
            account=account,
        )
        key = (provider, workspace, conversation)
        if self._undo is not None:
            self._undo.keep(self._sessions, key)
        if session_id is None:
            self._sessions.pop(key, None)
        else:
            self._sessions[key] = Session(provider, workspace, conversation, session_id, account)

    def sessions(self) -> list[Session]:
        """See :meth:`Store.sessions`."""
        self._check_open()
        return [self._sessions[key] for key in sorted(self._sessions)]

    def set_account_limit(
        self, provider: str, account: str | None, until: float, message: str
    ) -> None:
        """See :meth:`Store.set_account_limit`."""
        self._check_open()
        until = check_now(until)
        check_limit_text(provider, account, message=message)
        if self._undo is not None:
            self._undo.keep(self._limits, (provider, account))
        self._limits[provider, account] = AccountLimit(provider, account, until, message)

    def account_limits(self, now: float) -> list[AccountLimit]:
        """See :meth:`Store.account_limits`."""
        self._check_open()
        now = check_now(now)
        return sorted(
            (limit for limit in self._limits.values() if limit.until > now),
            # None first, as SQLite's '' sorts before every account name.
            key=lambda limit: (limit.provider, limit.account is not None, limit.account or ""),
        )

    def clear_account_limit(self, provider: str, account: str | None) -> None:
        """See :meth:`Store.clear_account_limit`."""
        self._check_open()
        check_limit_text(provider, account)
        if self._undo is not None:
            self._undo.keep(self._limits, (provider, account))
        self._limits.pop((provider, account), None)

    def account_usage(self, since: float) -> list[AccountUse]:
        """See :meth:`Store.account_usage`."""
        self._check_open()
        since = check_now(since)
        used = [
            AccountUse(
                r.provider,
                r.account,
                r.started_at,
                r.started_at if r.status is RunStatus.LOST else r.finished_at,
                *budget_charge(r.spend),
            )
            for r in self._runs.values()
            if r.account is not None
            and r.started_at is not None
            and (
                r.started_at >= since
                or (r.finished_at is not None and r.finished_at >= since)
                or r.status is RunStatus.RUNNING
            )
            # Ended without an exit code and not lost: never spawned.
            and (r.exit_code is not None or r.status in (RunStatus.RUNNING, RunStatus.LOST))
        ]
        # Earlier attempts after the runs' own rows, by run then attempt, as
        # the SQL stores read them; each under its own account, start and end.
        used += [use for use, _ in self.earlier_usage(since)]
        # Stable sort over seq order: ties on started_at stay by seq.
        used.sort(key=lambda use: use.started_at)
        return used

    def earlier_usage(self, since: float) -> list[tuple[AccountUse, str | None]]:
        """:meth:`account_usage`'s earlier attempts, each with the fleet member that ran it.

        By run (``seq``) then attempt, unsorted by start; ``since`` checked by the caller.
        """
        return [
            (
                AccountUse(
                    r.provider,
                    a.account,
                    a.started_at,
                    a.started_at if a.status is RunStatus.LOST else a.finished_at,
                    # Moved off its account (failure None): charged no spend.
                    *budget_charge(None if a.failure is None else a.spend),
                ),
                a.held_by,
            )
            for r in self._runs.values()
            for a in self._attempts.get(r.id, ())
            if a.account is not None
            and a.started_at is not None
            and (a.started_at >= since or (a.finished_at is not None and a.finished_at >= since))
            and (a.exit_code is not None or a.status is RunStatus.LOST or a.failure is None)
        ]

    def usage(self, by: UsageBy, since: float | None = None) -> list[UsageTotal]:
        """See :meth:`Store.usage`."""
        self._check_open()
        if since is not None:
            since = check_now(since)
        spent = [
            SpentAttempt(r.id, r.provider, account, r.workspace, r.conversation, spend)
            for r in sorted(self._runs.values(), key=lambda r: r.seq)
            # Oldest first; the run's own record is its newest attempt.
            for account, finished_at, spend in (
                *((a.account, a.finished_at, a.spend) for a in self._attempts.get(r.id, ())),
                (r.account, r.finished_at, r.spend),
            )
            if spend is not None
            and (since is None or (finished_at is not None and finished_at >= since))
        ]
        return usage_totals(spent, by)

    def counts(self) -> Mapping[RunStatus, int]:
        """See :meth:`Store.counts`.

        Counted when asked, like the other listings: no caller asks per run,
        while tallying at every state change cost each run three updates.
        """
        self._check_open()
        tally = Counter(record.status for record in self._runs.values())
        return {status: tally[status] for status in RunStatus}

    def close(self) -> None:
        """See :meth:`Store.close`."""
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def _existing(self, run_id: str) -> RunRecord:
        record = self._runs.get(run_id)
        if record is None:
            raise not_found(run_id)
        return record

    def _put(self, record: RunRecord) -> None:
        undo = self._undo
        if undo is not None:
            undo.append((self._unput, record, self._runs.get(record.id)))
        self._runs[record.id] = record

    def _unput(self, record: RunRecord, previous: RunRecord | None) -> None:
        """Undo the :meth:`_put` of ``record`` over ``previous`` (``None``: it was new)."""
        if previous is not None:
            self._runs[record.id] = previous
            self._ended(previous)  # its end may have left the heap meanwhile
            return
        del self._runs[record.id]
        # Undone newest first: its seq is handed out again, as SQLite's
        # rolled-back AUTOINCREMENT counter does.
        self._last_seq = record.seq - 1

    def _unprune(self, doomed: list[RunRecord]) -> None:
        """Put back the runs :meth:`prune` deleted, in seq order (the dict's order)."""
        runs = [*self._runs.values(), *doomed]
        runs.sort(key=lambda record: record.seq)
        self._runs = {record.id: record for record in runs}
        for record in doomed:
            self._ended(record)

    def _ended(self, record: RunRecord) -> None:
        """Put ``record``'s end, if it has one, in the heap prune reads.

        Called for every record put with an end, and for one put back by an
        undo (whose end may have left the heap meanwhile): an end in the heap
        twice is harmless.
        """
        if record.finished_at is not None:
            heappush(self._ends, (record.finished_at, record.id))
