"""The run ledger over SQL: every store method, shared by SQLite and PostgreSQL.

Why this module is long: :class:`SqlStore` is every method of the ledger
port over SQL, each under the one transaction discipline, and keeping them in
one class is what makes SQLite and PostgreSQL answer alike; its values and
checks live in :mod:`~herdsman.runtime.store.records`.

:class:`SqlStore` holds the store methods' queries and the transaction
discipline, on the runs queries of :mod:`herdsman.runtime.store.queries`; a
subclass brings the connection (opening it, migrating its schema, beginning
a transaction, recognising its driver's errors). Queries are written with
``?`` placeholders and plain SQL both databases run alike, so the two stores
cannot drift apart: a rule changed here changes for both.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import outcome

from herdsman.runtime.runner.run_usage import Tokens
from herdsman.runtime.store.errors import (
    CommitOutcomeUnknown,
    ConnectionLost,
    StoreError,
    nested_apply,
)
from herdsman.runtime.store.queries import (
    ACCOUNT_USAGE,
    ACCOUNT_USAGE_EARLIER,
    INSERT_ATTEMPT,
    PRUNE_ATTEMPTS,
    SELECT_ATTEMPTS,
    SELECT_RUNS,
    SPEND_COLUMNS,
    Cursor,
    attempt_from_row,
    attempt_values,
    existing_run,
    fetch_run,
    insert_new,
    limit_key,
    run_from_row,
    spend_from_row,
    unstorable,
    update_run,
)
from herdsman.runtime.store.records import (
    LOST_ON_RESTART,
    TERMINAL_STATUSES,
    AccountLimit,
    AccountUse,
    Attempt,
    NewRun,
    RunEnd,
    RunRecord,
    RunStatus,
    Session,
    attempt_of,
    attempts_in_session,
    check_limit,
    check_limit_text,
    check_now,
    check_text,
    ended,
    finished,
    needs_before,
    not_queued,
    noted,
    requeued,
    started,
)
from herdsman.runtime.store.usage import SpentAttempt, UsageBy, UsageTotal, usage_totals

if TYPE_CHECKING:
    from herdsman.runtime.store.base import Store

__all__ = ["SqlStore"]


_SESSION_SELECT = (
    "SELECT provider, workspace, conversation, session_id, account FROM conversation_sessions"
)
_TERMINAL = tuple(sorted(s.value for s in TERMINAL_STATUSES))


class SqlStore:
    """A :class:`~herdsman.runtime.store.base.Store` over one SQL connection.

    Safe to call from ``trio.to_thread`` worker threads: a lock lets one
    thread at a time use the connection. Every state change is one
    transaction; inside :meth:`apply` each operation is a savepoint of the
    batch's transaction, and each call a savepoint within it. Subclasses
    call this ``__init__`` first, then open the connection.
    """

    #: The driver's exception base classes, turned into :class:`StoreError`.
    _driver_errors: tuple[type[Exception], ...] = ()

    def __init__(self) -> None:
        """Set up what every SQL store shares: the lock, no batch, not closed."""
        # Re-entrant: ``apply`` holds it while the operations it runs take it again.
        self._lock = threading.RLock()
        self._batch: Cursor | None = None
        # The error of an operation of the running batch that could not be undone.
        self._batch_failure: BaseException | None = None
        # Whether the running operation of a batch has yet to open its
        # savepoint: its first store call opens it (see _call_savepoint).
        self._savepoint_owed = False
        self._closed = False

    # --- what a subclass provides ------------------------------------------

    def _describe(self) -> str:
        """The ledger as error messages name it (never with a password)."""
        raise NotImplementedError

    def _cursor(self) -> Cursor:
        """A new cursor on the connection."""
        raise NotImplementedError

    def _begin(self, cur: Cursor, durable: bool) -> None:
        """Begin a write transaction; ``durable`` commits must reach the disk."""
        raise NotImplementedError

    def _in_transaction(self) -> bool:
        """Whether a transaction is open (a failed COMMIT may have ended it)."""
        raise NotImplementedError

    def _close_connection(self) -> None:
        """Close the connection."""
        raise NotImplementedError

    def _update_run(self, cur: Cursor, current: RunRecord, record: RunRecord) -> None:
        """Write ``record`` over ``current``, guarded by its status (a fleet adds its own guard)."""
        update_run(cur, current, record)

    # --- transactions --------------------------------------------------------

    def _message(self, exc: BaseException) -> str:
        """A driver error's text as a store error may carry it (a subclass cleans it)."""
        return str(exc)

    def _connection_lost(self) -> bool:
        """Whether the connection to the database server is gone (never, for a file)."""
        return False

    def _ensure_connected(self) -> None:
        """Connect again if the connection was lost (a server's store), or raise why not.

        Called, holding the lock, before each transaction or read outside a
        batch: never inside one, whose transaction died with its connection.
        """

    def _failure(self, exc: Exception) -> StoreError:
        kind = ConnectionLost if self._connection_lost() else StoreError
        return kind(f"{self._describe()}: {self._message(exc)}")

    def _open_cursor(self) -> Cursor:
        try:
            return self._cursor()
        except self._driver_errors as exc:  # the connection is gone
            raise self._failure(exc) from exc

    @contextmanager
    def _transaction(self, *, durable: bool = False, batch: bool = False) -> Iterator[Cursor]:
        """One write transaction, holding the connection lock; commit or roll back.

        ``batch``: the transaction of :meth:`apply`, whose operations open
        their own (savepoint) transactions inside it.
        """
        with self._lock:
            self._check_open()
            if self._batch is not None:
                # Inside ``apply``: each operation is a savepoint of its transaction.
                with self._as_store_errors(), self._call_savepoint(self._batch):
                    yield self._batch
                return
            self._ensure_connected()
            cur = self._open_cursor()
            try:
                self._begin(cur, durable)
            except self._driver_errors as exc:
                cur.close()
                raise self._failure(exc) from exc
            try:
                yield cur
                self._commit(cur)
            except BaseException as exc:
                self._roll_back(cur, exc)
                if isinstance(exc, self._driver_errors):
                    raise self._failure(exc) from exc
                raise
            finally:
                cur.close()

    def _roll_back(self, cur: Cursor, exc: BaseException) -> None:
        """Roll back after ``exc``; a rollback that fails too never hides ``exc``.

        ``exc`` stays the error reported: a driver's as :class:`StoreError`
        naming both failures and caused by the rollback's; any other (a
        conflict, a cancel) as itself, with the rollback's failure in a note.
        """
        try:
            # A failed COMMIT may already have rolled back; a second
            # ROLLBACK would raise and hide the real error.
            if self._in_transaction():
                cur.execute("ROLLBACK")
        except self._driver_errors as rollback_exc:
            self._report_failed_undo(exc, rollback_exc)

    def _report_failed_undo(self, exc: BaseException, rollback_exc: Exception) -> None:
        """Report ``exc``, not the failed rollback after it, as :meth:`_roll_back` says."""
        # Both through _message: a driver's raw text may span lines or name a password.
        undo = self._message(rollback_exc)
        if isinstance(exc, self._driver_errors):
            raise StoreError(
                f"{self._describe()}: {self._message(exc)} (and the rollback failed: {undo})"
            ) from rollback_exc
        exc.add_note(f"{self._describe()}: the rollback failed too: {undo}")

    @contextmanager
    def _as_store_errors(self) -> Iterator[None]:
        """The driver's errors as :class:`StoreError`, as callers of a store expect."""
        try:
            yield
        except self._driver_errors as exc:
            raise self._failure(exc) from exc

    def _transaction_aborted(self) -> bool:
        """Whether the open transaction can no longer commit (PostgreSQL's aborted state)."""
        return False

    def _commit(self, cur: Cursor) -> None:
        if self._connection_lost():
            # Lost under an operation of the batch, before the COMMIT was
            # sent: the server rolled the transaction back with the
            # connection, so nothing of it was recorded (not "may have been").
            raise ConnectionLost(
                f"{self._describe()}: the connection was lost before COMMIT was sent,"
                " so nothing of the change was recorded"
            )
        if self._transaction_aborted():
            # PostgreSQL would answer this COMMIT with a silent ROLLBACK:
            # report the batch as failed, not as kept.
            raise StoreError(f"{self._describe()}: the transaction failed and was rolled back")
        try:
            cur.execute("COMMIT")
        except self._driver_errors as exc:
            # A server that answered the COMMIT with an error rolled back; one
            # whose answer never came may have committed: no caller may be
            # told the change was not recorded.
            if not self._connection_lost():
                raise
            raise CommitOutcomeUnknown(
                f"{self._describe()}: the connection was lost after COMMIT was sent,"
                f" so the change may have been recorded: {self._message(exc)}"
            ) from exc

    @contextmanager
    def _savepoint(self, cur: Cursor) -> Iterator[None]:
        """Undo only this operation if it fails; the batch goes on.

        If undoing it fails too, the operation's error is still the one
        raised (as :meth:`_roll_back` reports it), and the batch is doomed:
        what the operation changed may be in its transaction still, or the
        database may have rolled the whole transaction back already. So every
        later store call of the batch is refused here (in SQLite, outside a
        transaction, its savepoint would begin and commit one of its own), and
        :meth:`apply` rolls everything back and raises.
        """
        self._open_savepoint(cur)
        try:
            yield
            # Inside the try: a savepoint left open would commit with the
            # batch what its operation was told had failed.
            cur.execute("RELEASE SAVEPOINT operation")
        except BaseException as exc:
            self._undo_savepoint(cur, exc)
            raise

    def _open_savepoint(self, cur: Cursor) -> None:
        if self._batch_failure is not None:
            raise StoreError(
                f"{self._describe()}: not applied: an earlier operation of its batch"
                f" could not be undone ({self._batch_failure})"
            )
        cur.execute("SAVEPOINT operation")

    @contextmanager
    def _call_savepoint(self, cur: Cursor) -> Iterator[None]:
        """A store call inside a batch's operation: undone alone if it fails.

        The operation's first store call opens the operation's savepoint
        and shares it: nothing of the operation precedes the call, so
        rolling back to it undoes the call alone, as a savepoint of its own
        would, and the operation's end releases it. Most operations make
        one store call (a finish, a batch's starts): two statements fewer
        each, of some six. Later calls get a savepoint of their own.
        """
        if not self._savepoint_owed:
            with self._savepoint(cur):
                yield
            return
        self._open_savepoint(cur)
        self._savepoint_owed = False
        try:
            yield
        except BaseException as exc:
            # Undone, and the savepoint kept: the operation may go on
            # (having caught this), and its end releases it.
            self._undo_savepoint(cur, exc, release=False)
            raise

    def _undo_savepoint(self, cur: Cursor, exc: BaseException, *, release: bool = True) -> None:
        """Roll back to the operation's savepoint after ``exc``; doom the batch if that fails.

        ``release``: end the savepoint too (else it stays open, empty).
        """
        if self._batch_failure is not None:
            # A store call inside this operation could not be undone: the
            # batch is doomed and rolled back whole, so this undo is moot
            # (and would only report the same failure twice).
            return
        try:
            cur.execute("ROLLBACK TO SAVEPOINT operation")
            if release:
                cur.execute("RELEASE SAVEPOINT operation")
        except self._driver_errors as undo_exc:
            try:
                self._report_failed_undo(exc, undo_exc)
            except StoreError as both:
                self._batch_failure = both
                raise
            self._batch_failure = exc

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        """See :meth:`Store.apply`: one transaction, one commit."""
        with self._lock:
            # Under the lock, so only this thread's own batch can be open:
            # inside it, _transaction would give a savepoint and the finally
            # below would end the batch for the operations after this one.
            if self._batch is not None:
                raise nested_apply()
            return self._apply_batch(operations, durable)

    def _apply_batch(
        self, operations: Sequence[Callable[[Store], Any]], durable: bool
    ) -> list[outcome.Outcome[Any]]:
        with self._transaction(durable=durable, batch=True) as cur:
            self._batch, self._batch_failure = cur, None
            try:
                results = [outcome.capture(self._operation, cur, op) for op in operations]
                failure = self._batch_failure
            finally:
                self._batch, self._batch_failure = None, None
            if failure is not None:
                # Raised inside the transaction: it is rolled back, savepoints and all.
                raise StoreError(
                    f"{self._describe()}: the batch was rolled back: an operation failed"
                    f" and could not be undone: {failure}"
                ) from failure
            return results

    def _operation(self, cur: Cursor, operation: Callable[[Store], Any]) -> Any:
        """One operation of a batch, all or nothing: a savepoint around all its store calls.

        The base savepoint, not :meth:`_transaction`: an operation that only
        reads must take no write lock (a fleet's), as its reads take none.
        The savepoint is opened by the operation's first store call
        (:meth:`_call_savepoint`): one that makes none needs none.
        """
        with self._as_store_errors():
            self._savepoint_owed = True
            try:
                result = operation(self)
                if not self._savepoint_owed:
                    # Inside the try, as in _savepoint.
                    cur.execute("RELEASE SAVEPOINT operation")
            except BaseException as exc:
                if not self._savepoint_owed:
                    self._undo_savepoint(cur, exc)
                raise
            finally:
                self._savepoint_owed = False
            return result

    @contextmanager
    def _reading(self) -> Iterator[Cursor]:
        """A cursor for single-statement reads (each one is atomic on its own)."""
        with self._lock:
            self._check_open()
            if self._batch is not None:
                # Inside ``apply``: a read that fails (a lock timeout, say)
                # must be undone alone, or on PostgreSQL it would abort the
                # whole batch's transaction.
                with self._as_store_errors(), self._call_savepoint(self._batch):
                    yield self._batch
                return
            self._ensure_connected()
            cur = self._open_cursor()
            try:
                yield cur
            except self._driver_errors as exc:
                raise self._failure(exc) from exc
            finally:
                cur.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    # --- runs ----------------------------------------------------------------

    def submit(self, new: NewRun, now: float) -> tuple[RunRecord, bool]:
        """See :meth:`Store.submit`."""
        return self._create(new, now, RunStatus.QUEUED, None)

    def skip(self, new: NewRun, now: float, reason: str) -> tuple[RunRecord, bool]:
        """See :meth:`Store.skip`."""
        return self._create(new, now, RunStatus.SKIPPED, reason)

    def _create(
        self, new: NewRun, now: float, status: RunStatus, reason: str | None
    ) -> tuple[RunRecord, bool]:
        with self._transaction() as cur:
            now = check_now(now)
            existing = fetch_run(cur, new.id)
            if existing is not None:
                return existing, False
            return insert_new(cur, new, now, status, reason)

    def mark_running(self, run_id: str, now: float, account: str | None) -> RunRecord:
        """See :meth:`Store.mark_running`. Durable when it returns."""
        return self.mark_running_many([(run_id, account)], now)[0]

    def mark_running_many(
        self, items: Sequence[tuple[str, str | None]], now: float
    ) -> list[RunRecord]:
        """See :meth:`Store.mark_running_many`: one durable transaction for all."""
        out: list[RunRecord] = []
        with self._transaction(durable=True) as cur:
            now = check_now(now)
            for run_id, account in items:
                # Reads see this transaction's own earlier updates, so an id
                # listed twice is found running the second time and refused.
                current = existing_run(cur, run_id)
                record = started(current, now, account)
                self._update_run(cur, current, record)
                out.append(record)
        return out

    def finish(self, run_id: str, end: RunEnd, now: float) -> RunRecord:
        """See :meth:`Store.finish`."""
        with self._transaction() as cur:
            now = check_now(now)
            current = existing_run(cur, run_id)
            before = (
                _session_before(cur, current, end)
                if end.usage is not None and needs_before(end)
                else None
            )
            record = finished(current, end, now, before)
            self._update_run(cur, current, record)
            return record

    def cancel_queued(self, run_id: str, now: float, reason: str) -> RunRecord:
        """See :meth:`Store.cancel_queued`."""
        with self._transaction() as cur:
            now = check_now(now)
            current = existing_run(cur, run_id)
            if current.status is not RunStatus.QUEUED:
                raise not_queued(current)
            record = ended(current, RunStatus.CANCELLED, now, reason)
            self._update_run(cur, current, record)
            return record

    def requeue(
        self, run_id: str, *, failure: str | None = None, retry_at: float | None = None
    ) -> RunRecord:
        """See :meth:`Store.requeue`."""
        with self._transaction() as cur:
            current = existing_run(cur, run_id)
            record = requeued(current)
            cur.execute(INSERT_ATTEMPT, attempt_values(attempt_of(current, failure, retry_at)))
            self._update_run(cur, current, record)
            return record

    def attempts(self, run_id: str) -> list[Attempt]:
        """See :meth:`Store.attempts`."""
        with self._reading() as cur:
            return [attempt_from_row(row) for row in cur.execute(SELECT_ATTEMPTS, (run_id,))]

    def add_note(self, run_id: str, note: str) -> RunRecord:
        """See :meth:`Store.add_note`."""
        with self._transaction() as cur:
            current = existing_run(cur, run_id)
            record = noted(current, note)
            cur.execute(
                "UPDATE runs SET notes = ? WHERE id = ?",
                (json.dumps(list(record.notes)), run_id),
            )
            return record

    def get(self, run_id: str) -> RunRecord | None:
        """See :meth:`Store.get`."""
        with self._reading() as cur:
            return fetch_run(cur, run_id)

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
        where: list[str] = []
        params: list[Any] = []
        for clause, value in (
            ("status = ?", None if status is None else status.value),
            ("provider = ?", provider),
            ("conversation = ?", conversation),
            ("workspace = ?", workspace),
            ("seq > ?", after_seq),
            ("seq < ?", before_seq),
        ):
            if value is not None:
                where.append(clause)
                params.append(value)
        if any(unstorable(p) for p in params):
            return []
        sql = SELECT_RUNS
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC LIMIT ?"
        params.append(limit)
        with self._reading() as cur:
            check_limit(limit)
            return [run_from_row(row) for row in cur.execute(sql, params)]

    def queued_in_order(self) -> list[RunRecord]:
        """See :meth:`Store.queued_in_order`."""
        with self._reading() as cur:
            rows = cur.execute(
                f"{SELECT_RUNS} WHERE status = ? ORDER BY seq", (RunStatus.QUEUED.value,)
            )
            return [run_from_row(row) for row in rows]

    def recover(self, now: float) -> list[RunRecord]:
        """See :meth:`Store.recover`. One transaction: all running runs, or none, become lost."""
        out: list[RunRecord] = []
        with self._transaction() as cur:
            now = check_now(now)
            rows = cur.execute(
                f"{SELECT_RUNS} WHERE status = ? ORDER BY seq", (RunStatus.RUNNING.value,)
            ).fetchall()
            for row in rows:
                current = run_from_row(row)
                record = ended(current, RunStatus.LOST, now, LOST_ON_RESTART)
                self._update_run(cur, current, record)
                out.append(record)
        return out

    def prune(self, finished_before: float) -> int:
        """See :meth:`Store.prune`."""
        with self._transaction() as cur:
            finished_before = check_now(finished_before)
            marks = ", ".join("?" * len(_TERMINAL))
            cur.execute(
                f"DELETE FROM runs WHERE finished_at < ? AND status IN ({marks})",
                (finished_before, *_TERMINAL),
            )
            pruned: int = cur.rowcount
            if pruned:
                cur.execute(PRUNE_ATTEMPTS)
            return pruned

    # --- sessions and accounts -----------------------------------------------

    def conversation_session(
        self, provider: str, workspace: str, conversation: str
    ) -> Session | None:
        """See :meth:`Store.conversation_session`."""
        if any(map(unstorable, (provider, workspace, conversation))):
            return None
        with self._reading() as cur:
            row = cur.execute(
                f"{_SESSION_SELECT} WHERE provider = ? AND workspace = ? AND conversation = ?",
                (provider, workspace, conversation),
            ).fetchone()
            return None if row is None else Session(*row)

    def sessions(self) -> list[Session]:
        """See :meth:`Store.sessions`."""
        with self._reading() as cur:
            rows = cur.execute(f"{_SESSION_SELECT} ORDER BY provider, workspace, conversation")
            return [Session(*row) for row in rows]

    def set_conversation_session(
        self,
        provider: str,
        workspace: str,
        conversation: str,
        session_id: str | None,
        account: str | None = None,
    ) -> None:
        """See :meth:`Store.set_conversation_session`."""
        with self._transaction() as cur:
            check_text(
                conversation,
                provider=provider,
                workspace=workspace,
                conversation=conversation,
                session_id=session_id,
                account=account,
            )
            key = (provider, workspace, conversation)
            if session_id is None:
                cur.execute(
                    "DELETE FROM conversation_sessions"
                    " WHERE provider = ? AND workspace = ? AND conversation = ?",
                    key,
                )
            else:
                cur.execute(
                    "INSERT INTO conversation_sessions"
                    " (provider, workspace, conversation, session_id, account)"
                    " VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (provider, workspace, conversation)"
                    " DO UPDATE SET session_id = excluded.session_id, account = excluded.account",
                    (*key, session_id, account),
                )

    def set_account_limit(
        self, provider: str, account: str | None, until: float, message: str
    ) -> None:
        """See :meth:`Store.set_account_limit`."""
        with self._transaction() as cur:
            until = check_now(until)
            check_limit_text(provider, account, message=message)
            cur.execute(
                "INSERT INTO account_limits (provider, account, until, message)"
                " VALUES (?, ?, ?, ?)"
                " ON CONFLICT (provider, account)"
                " DO UPDATE SET until = excluded.until, message = excluded.message",
                (provider, limit_key(account), until, message),
            )

    def account_limits(self, now: float) -> list[AccountLimit]:
        """See :meth:`Store.account_limits`."""
        with self._reading() as cur:
            now = check_now(now)
            # '' (ambient) sorts before every non-empty name: None comes first.
            rows = cur.execute(
                "SELECT provider, account, until, message FROM account_limits"
                " WHERE until > ? ORDER BY provider, account",
                (now,),
            )
            return [
                AccountLimit(provider, account or None, until, message)
                for provider, account, until, message in rows
            ]

    def clear_account_limit(self, provider: str, account: str | None) -> None:
        """See :meth:`Store.clear_account_limit`."""
        with self._transaction() as cur:
            check_limit_text(provider, account)
            cur.execute(
                "DELETE FROM account_limits WHERE provider = ? AND account = ?",
                (provider, limit_key(account)),
            )

    def account_usage(self, since: float) -> list[AccountUse]:
        """See :meth:`Store.account_usage`."""
        with self._reading() as cur:
            since = check_now(since)
            running, lost = RunStatus.RUNNING.value, RunStatus.LOST.value
            rows = cur.execute(ACCOUNT_USAGE, (lost, since, since, running, running, lost))
            used = [AccountUse(*row) for row in rows]
            earlier = cur.execute(ACCOUNT_USAGE_EARLIER, (lost, since, since, lost)).fetchall()
        if earlier:
            # Stable: at equal starts, the runs' own rows, then earlier attempts.
            used = sorted((*used, *(AccountUse(*row) for row in earlier)), key=_started)
        return used

    def usage(self, by: UsageBy, since: float | None = None) -> list[UsageTotal]:
        """See :meth:`Store.usage`."""
        with self._reading() as cur:
            if since is None:
                rows = cur.execute(_SPENT_ATTEMPTS + " ORDER BY 1, 2")
            else:
                since = check_now(since)
                rows = cur.execute(_SPENT_ATTEMPTS_SINCE + " ORDER BY 1, 2", (since, since))
            spent = [_spent_attempt(row) for row in rows]
        return usage_totals(spent, by)

    def counts(self) -> Mapping[RunStatus, int]:
        """See :meth:`Store.counts`."""
        with self._reading() as cur:
            found = dict(cur.execute("SELECT status, COUNT(*) FROM runs GROUP BY status"))
        return {status: int(found.get(status.value, 0)) for status in RunStatus}

    def close(self) -> None:
        """See :meth:`Store.close`."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close_connection()


# Every attempt with a spend (models IS NOT NULL, see SPEND_COLUMNS): each
# run's newest, in its own row, and its earlier ones, in run_attempts, which
# take their run's place (seq) and lanes but keep their own account. The
# first two columns order them: by run, oldest attempt first (a run's own
# row is its newest: its attempts count is above every earlier one's).
_SPENT_OWN = (
    "SELECT seq, attempts, id, provider, account, workspace, conversation,"
    f" {', '.join(SPEND_COLUMNS)} FROM runs WHERE models IS NOT NULL"
)
_SPENT_EARLIER = (
    "SELECT r.seq, a.attempt, r.id, r.provider, a.account, r.workspace, r.conversation,"
    f" {', '.join('a.' + column for column in SPEND_COLUMNS)}"
    " FROM run_attempts a JOIN runs r ON r.id = a.run_id WHERE a.models IS NOT NULL"
)
_SPENT_ATTEMPTS = f"{_SPENT_OWN} UNION ALL {_SPENT_EARLIER}"
# Parameters: since, twice (runs_by_finished_at serves the runs).
_SPENT_ATTEMPTS_SINCE = (
    f"{_SPENT_OWN} AND finished_at >= ? UNION ALL {_SPENT_EARLIER} AND a.finished_at >= ?"
)


def _started(use: AccountUse) -> float:
    return use.started_at


def _spent_attempt(row: Sequence[Any]) -> SpentAttempt:
    spend = spend_from_row(row[7:])
    assert spend is not None  # models IS NOT NULL
    return SpentAttempt(row[2], row[3], row[4], row[5], row[6], spend)


# The spend of the earlier runs of a session, in its conversation (the one
# lane a session is resumed on): runs_by_conversation finds them.
_SESSION_SPENT = (
    "SELECT SUM(input_tokens), SUM(cache_read_tokens), SUM(cache_write_tokens),"
    " SUM(output_tokens), SUM(reasoning_tokens) FROM runs"
    " WHERE conversation = ? AND seq < ? AND provider = ? AND workspace = ?"
    " AND session_id = ? AND input_tokens IS NOT NULL"
)


def _session_before(cur: Cursor, current: RunRecord, end: RunEnd) -> Tokens | None:
    """What the runs of ``end``'s session before ``current`` spent (see :meth:`Store.finish`).

    With what ``current``'s own earlier attempts spent in it
    (:func:`attempts_in_session`); a run that never went back to the queue
    costs no read of ``run_attempts``.
    """
    if current.conversation is None or unstorable(end.session_id):
        return None
    row = cur.execute(
        _SESSION_SPENT,
        (current.conversation, current.seq, current.provider, current.workspace, end.session_id),
    ).fetchone()
    # PostgreSQL sums BIGINTs as NUMERIC.
    runs = None if row is None or row[0] is None else Tokens(*(int(value) for value in row))
    if current.attempts < 2 or end.session_id != current.session_id:
        return runs
    earlier = [attempt_from_row(r) for r in cur.execute(SELECT_ATTEMPTS, (current.id,))]
    own = attempts_in_session(current, end, earlier)
    if own is None or runs is None:
        return own or runs
    return runs + own
