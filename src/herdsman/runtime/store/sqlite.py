"""The SQLite store: the default, single-machine run ledger (one file, WAL mode)."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import outcome

from herdsman.runtime.store.errors import StoreConflict, StoreError

if TYPE_CHECKING:
    from herdsman.runtime.store.base import Store
from herdsman.runtime.store.records import (
    LOST_ON_RESTART,
    TERMINAL_STATUSES,
    AccountLimit,
    AccountUse,
    NewRun,
    RunRecord,
    RunStatus,
    Session,
    check_limit,
    check_limit_text,
    check_now,
    check_text,
    finished,
    new_record,
    not_found,
    not_queued,
    noted,
    requeued,
    started,
)

# Each entry migrates the schema from version i to i + 1; the file's version
# is PRAGMA user_version. Append only: never edit a released entry, since
# files in the field were built by it.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        # AUTOINCREMENT, unlike a bare rowid, never reuses a seq once the
        # newest run has been pruned: seq stays strictly increasing for life.
        """
        CREATE TABLE runs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            provider TEXT NOT NULL,
            prompt TEXT NOT NULL,
            conversation TEXT,
            agent TEXT,
            workspace TEXT NOT NULL,
            callback_url TEXT,
            metadata TEXT NOT NULL,
            status TEXT NOT NULL,
            submitted_at REAL NOT NULL,
            started_at REAL,
            finished_at REAL,
            account TEXT,
            exit_code INTEGER,
            reason TEXT,
            result TEXT,
            session_id TEXT,
            excerpt TEXT,
            log_path TEXT,
            attempts INTEGER NOT NULL
        )
        """,
        # queued_in_order, recover, list_runs(status=...), counts.
        "CREATE INDEX runs_by_status ON runs (status, seq)",
        "CREATE INDEX runs_by_provider ON runs (provider, seq)",
        "CREATE INDEX runs_by_conversation ON runs (conversation, seq)",
        "CREATE INDEX runs_by_workspace ON runs (workspace, seq)",
        # prune
        "CREATE INDEX runs_by_finished_at ON runs (finished_at)",
        """
        CREATE TABLE conversation_sessions (
            provider TEXT NOT NULL,
            workspace TEXT NOT NULL,
            conversation TEXT NOT NULL,
            session_id TEXT NOT NULL,
            PRIMARY KEY (provider, workspace, conversation)
        ) WITHOUT ROWID
        """,
    ),
    # 2: notes on a run (a JSON list of strings), e.g. a failed checkout.
    ("ALTER TABLE runs ADD COLUMN notes TEXT NOT NULL DEFAULT '[]'",),
    # 3: the working directory a run names, if any.
    ("ALTER TABLE runs ADD COLUMN cwd TEXT",),
    # 4: the account tracker.
    (
        # The account whose config directory holds the session; NULL is the
        # ambient environment, which is also what every older row was.
        "ALTER TABLE conversation_sessions ADD COLUMN account TEXT",
        # account is '' for the ambient environment, not NULL: NULLs are
        # all distinct in a primary key, so NULL would allow duplicates.
        """
        CREATE TABLE account_limits (
            provider TEXT NOT NULL,
            account TEXT NOT NULL,
            until REAL NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (provider, account)
        ) WITHOUT ROWID
        """,
        # account_usage: a range on started_at instead of a table scan.
        "CREATE INDEX runs_by_started_at ON runs (started_at)",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)
"""The schema version this code writes; files with a higher version are refused."""

_COLUMNS = (
    "seq, id, provider, prompt, conversation, agent, workspace, callback_url, metadata,"
    " status, submitted_at, started_at, finished_at, account, exit_code, reason, result,"
    " session_id, excerpt, log_path, attempts, notes, cwd"
)
_SELECT = f"SELECT {_COLUMNS} FROM runs"
_SESSION_SELECT = (
    "SELECT provider, workspace, conversation, session_id, account FROM conversation_sessions"
)
_INSERT = (
    "INSERT INTO runs (id, provider, prompt, conversation, agent, workspace, callback_url,"
    " metadata, status, submitted_at, started_at, finished_at, account, exit_code, reason,"
    " result, session_id, excerpt, log_path, attempts, cwd)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The status in the WHERE clause is the one read in the same transaction:
# if anything else had moved the run meanwhile, no row matches and the change
# is refused, so two writers can never both win.
_UPDATE = (
    "UPDATE runs SET status = ?, started_at = ?, finished_at = ?, account = ?, exit_code = ?,"
    " reason = ?, result = ?, session_id = ?, excerpt = ?, log_path = ?, attempts = ?"
    " WHERE id = ? AND status = ?"
)
_TERMINAL = tuple(sorted(s.value for s in TERMINAL_STATUSES))
# Each OR term has its own index (runs_by_started_at, runs_by_finished_at,
# runs_by_status), so SQLite can union three index lookups. The unary + in
# ORDER BY keeps it from instead walking all of runs_by_started_at just to
# skip sorting the few rows found.
_ACCOUNT_USAGE = (
    "SELECT provider, account, started_at, finished_at FROM runs"
    " WHERE account IS NOT NULL AND started_at IS NOT NULL"
    " AND (started_at >= ? OR finished_at >= ? OR status = ?)"
    " ORDER BY +started_at, seq"
)


class SqliteStore:
    """A :class:`~herdsman.runtime.store.base.Store` in one SQLite file.

    Safe to call from ``trio.to_thread`` worker threads: a lock lets one
    thread at a time use the connection. Several processes may open the same
    file; every state change is one ``BEGIN IMMEDIATE`` transaction.
    """

    def __init__(self, path: Path, *, busy_timeout: float = 10.0) -> None:
        """Open (creating if needed) the ledger at ``path`` and bring its schema up to date.

        ``busy_timeout`` is how long, in seconds, a write waits for another
        process holding the file's write lock before failing.
        """
        self.path = path
        # Re-entrant: ``apply`` holds it while the operations it runs take it again.
        self._lock = threading.RLock()
        self._batch: sqlite3.Cursor | None = None
        self._closed = False
        try:
            # isolation_level=None: no implicit transactions; we issue
            # BEGIN IMMEDIATE/COMMIT ourselves so each change is exactly one.
            self._conn = sqlite3.connect(
                path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the run ledger {str(path)!r}: {exc}") from exc
        try:
            self._open()
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    def _open(self) -> None:
        try:
            # Check the version before anything writes to the file: a newer
            # herdsman's file must be left exactly as it is.
            self._check_version(self._user_version())
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"the run ledger {str(self.path)!r} cannot use WAL journaling"
                    f" (got {mode!r}); put the state directory on a local filesystem"
                )
            # At most once rests on mark_running being on disk before the
            # process is spawned. In WAL mode, synchronous=NORMAL survives a
            # killed process but may lose the last commits on power loss or an
            # OS crash, which would let a started run come back as queued and
            # run twice. So starts commit with FULL (an fsync of the WAL; one
            # per burst, as mark_running_many batches them), and every other
            # change with NORMAL: the WAL is sequential, so the next start's
            # fsync also makes every earlier submit and finish durable. A
            # fsync costs ~1.7 ms here; one per change capped the whole
            # supervisor at ~100 runs/s.
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._synchronous = "NORMAL"
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the run ledger {str(self.path)!r}: {exc}") from exc

    def _user_version(self) -> int:
        version: int = self._conn.execute("PRAGMA user_version").fetchone()[0]
        return version

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the run ledger {str(self.path)!r} has schema version {version}, newer than"
                f" this herdsman understands ({SCHEMA_VERSION}); it was written by a newer"
                " herdsman: upgrade herdsman, or point state_dir elsewhere"
            )

    def _migrate(self) -> None:
        if self._user_version() == SCHEMA_VERSION:
            return
        with self._transaction() as cur:
            # Read again under the write lock: another process may have
            # migrated the file between our first look and now.
            version = self._user_version()
            self._check_version(version)
            for statements in MIGRATIONS[version:]:
                for statement in statements:
                    cur.execute(statement)
            # user_version lives in the file header, which is part of the
            # transaction: the schema and its version commit together.
            cur.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")

    @property
    def schema_version(self) -> int:
        """The schema version of the open file."""
        with self._reading():
            return self._user_version()

    @contextmanager
    def _transaction(self, *, durable: bool = False) -> Iterator[sqlite3.Cursor]:
        """One write transaction, holding the connection lock; commit or roll back.

        ``durable`` commits with ``synchronous=FULL``: on disk when it returns,
        together with every commit before it.
        """
        with self._lock:
            self._check_open()
            if self._batch is not None:
                # Inside ``apply``: each operation is a savepoint of its transaction.
                with self._savepoint(self._batch):
                    yield self._batch
                return
            cur = self._conn.cursor()
            wanted = "FULL" if durable else "NORMAL"
            try:
                if self._synchronous != wanted:
                    # Only allowed between transactions, which is where we are.
                    cur.execute(f"PRAGMA synchronous = {wanted}")
                    self._synchronous = wanted
                # IMMEDIATE takes the write lock up front, so a transaction that
                # read a status cannot later fail to upgrade to writing.
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"run ledger {str(self.path)!r}: {exc}") from exc
            try:
                yield cur
                cur.execute("COMMIT")
            except BaseException as exc:
                # A failed COMMIT may already have rolled back; a second
                # ROLLBACK would raise and hide the real error.
                if self._conn.in_transaction:
                    cur.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"run ledger {str(self.path)!r}: {exc}") from exc
                raise
            finally:
                cur.close()

    @staticmethod
    @contextmanager
    def _savepoint(cur: sqlite3.Cursor) -> Iterator[None]:
        """Undo only this operation if it fails; the batch goes on."""
        cur.execute("SAVEPOINT operation")
        try:
            yield
        except BaseException:
            cur.execute("ROLLBACK TO operation")
            cur.execute("RELEASE operation")
            raise
        cur.execute("RELEASE operation")

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        """See :meth:`Store.apply`: one transaction, one commit (one fsync if durable)."""
        with self._transaction(durable=durable) as cur:
            self._batch = cur
            try:
                return [outcome.capture(operation, self) for operation in operations]
            finally:
                self._batch = None

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The connection for single-statement reads (each one is atomic on its own)."""
        with self._lock:
            self._check_open()
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise StoreError(f"run ledger {str(self.path)!r}: {exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

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
            existing = _fetch(cur, new.id)
            if existing is not None:
                return existing, False
            record = new_record(new, 0, now, status, reason)
            cur.execute(_INSERT, _insert_values(record))
            assert cur.lastrowid is not None
            return attrs.evolve(record, seq=cur.lastrowid), True

    def mark_running(self, run_id: str, now: float, account: str | None) -> RunRecord:
        """See :meth:`Store.mark_running`. Durable when it returns (``synchronous=FULL``)."""
        return self.mark_running_many([(run_id, account)], now)[0]

    def mark_running_many(
        self, items: Sequence[tuple[str, str | None]], now: float
    ) -> list[RunRecord]:
        """See :meth:`Store.mark_running_many`: one transaction, so one fsync, for all."""
        out: list[RunRecord] = []
        with self._transaction(durable=True) as cur:
            now = check_now(now)
            for run_id, account in items:
                # Reads see this transaction's own earlier updates, so an id
                # listed twice is found running the second time and refused.
                current = _existing(cur, run_id)
                record = started(current, now, account)
                _update(cur, current, record)
                out.append(record)
        return out

    def finish(
        self,
        run_id: str,
        status: RunStatus,
        now: float,
        *,
        exit_code: int | None = None,
        reason: str | None = None,
        result: str | None = None,
        session_id: str | None = None,
        excerpt: str | None = None,
        log_path: str | None = None,
    ) -> RunRecord:
        """See :meth:`Store.finish`."""
        with self._transaction() as cur:
            now = check_now(now)
            current = _existing(cur, run_id)
            record = finished(
                current,
                status,
                now,
                exit_code=exit_code,
                reason=reason,
                result=result,
                session_id=session_id,
                excerpt=excerpt,
                log_path=log_path,
            )
            _update(cur, current, record)
            return record

    def cancel_queued(self, run_id: str, now: float, reason: str) -> RunRecord:
        """See :meth:`Store.cancel_queued`."""
        with self._transaction() as cur:
            now = check_now(now)
            current = _existing(cur, run_id)
            if current.status is not RunStatus.QUEUED:
                raise not_queued(current)
            record = finished(
                current,
                RunStatus.CANCELLED,
                now,
                exit_code=None,
                reason=reason,
                result=None,
                session_id=None,
                excerpt=None,
                log_path=None,
            )
            _update(cur, current, record)
            return record

    def requeue(self, run_id: str) -> RunRecord:
        """See :meth:`Store.requeue`."""
        with self._transaction() as cur:
            current = _existing(cur, run_id)
            record = requeued(current)
            _update(cur, current, record)
            return record

    def add_note(self, run_id: str, note: str) -> RunRecord:
        """See :meth:`Store.add_note`."""
        with self._transaction() as cur:
            current = _existing(cur, run_id)
            record = noted(current, note)
            cur.execute(
                "UPDATE runs SET notes = ? WHERE id = ?",
                (json.dumps(list(record.notes)), run_id),
            )
            return record

    def get(self, run_id: str) -> RunRecord | None:
        """See :meth:`Store.get`."""
        with self._reading() as conn:
            return _fetch(conn.cursor(), run_id)

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
        sql = _SELECT
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC LIMIT ?"
        params.append(limit)
        with self._reading() as conn:
            check_limit(limit)
            return [_record(row) for row in conn.execute(sql, params)]

    def queued_in_order(self) -> list[RunRecord]:
        """See :meth:`Store.queued_in_order`."""
        with self._reading() as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE status = ? ORDER BY seq", (RunStatus.QUEUED.value,)
            )
            return [_record(row) for row in rows]

    def recover(self, now: float) -> list[RunRecord]:
        """See :meth:`Store.recover`. One transaction: all running runs, or none, become lost."""
        out: list[RunRecord] = []
        with self._transaction() as cur:
            now = check_now(now)
            rows = cur.execute(
                f"{_SELECT} WHERE status = ? ORDER BY seq", (RunStatus.RUNNING.value,)
            ).fetchall()
            for row in rows:
                current = _record(row)
                record = finished(
                    current,
                    RunStatus.LOST,
                    now,
                    exit_code=None,
                    reason=LOST_ON_RESTART,
                    result=None,
                    session_id=None,
                    excerpt=None,
                    log_path=None,
                )
                _update(cur, current, record)
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
            return cur.rowcount

    def conversation_session(
        self, provider: str, workspace: str, conversation: str
    ) -> Session | None:
        """See :meth:`Store.conversation_session`."""
        with self._reading() as conn:
            row = conn.execute(
                f"{_SESSION_SELECT} WHERE provider = ? AND workspace = ? AND conversation = ?",
                (provider, workspace, conversation),
            ).fetchone()
            return None if row is None else Session(*row)

    def sessions(self) -> list[Session]:
        """See :meth:`Store.sessions`."""
        with self._reading() as conn:
            rows = conn.execute(f"{_SESSION_SELECT} ORDER BY provider, workspace, conversation")
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
                (provider, _limit_key(account), until, message),
            )

    def account_limits(self, now: float) -> list[AccountLimit]:
        """See :meth:`Store.account_limits`."""
        with self._reading() as conn:
            now = check_now(now)
            # '' (ambient) sorts before every non-empty name: None comes first.
            rows = conn.execute(
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
                (provider, _limit_key(account)),
            )

    def account_usage(self, since: float) -> list[AccountUse]:
        """See :meth:`Store.account_usage`."""
        with self._reading() as conn:
            since = check_now(since)
            rows = conn.execute(_ACCOUNT_USAGE, (since, since, RunStatus.RUNNING.value))
            return [AccountUse(*row) for row in rows]

    def counts(self) -> Mapping[RunStatus, int]:
        """See :meth:`Store.counts`."""
        with self._reading() as conn:
            found = dict(conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status"))
        return {status: int(found.get(status.value, 0)) for status in RunStatus}

    def close(self) -> None:
        """See :meth:`Store.close`."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()


def _limit_key(account: str | None) -> str:
    """``account`` as the account_limits table keys it: ambient (``None``) is ``''``."""
    return "" if account is None else account


def _fetch(cur: sqlite3.Cursor, run_id: str) -> RunRecord | None:
    row = cur.execute(f"{_SELECT} WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else _record(row)


def _existing(cur: sqlite3.Cursor, run_id: str) -> RunRecord:
    record = _fetch(cur, run_id)
    if record is None:
        raise not_found(run_id)
    return record


def _update(cur: sqlite3.Cursor, current: RunRecord, record: RunRecord) -> None:
    cur.execute(
        _UPDATE,
        (
            record.status.value,
            record.started_at,
            record.finished_at,
            record.account,
            record.exit_code,
            record.reason,
            record.result,
            record.session_id,
            record.excerpt,
            record.log_path,
            record.attempts,
            current.id,
            current.status.value,
        ),
    )
    if cur.rowcount != 1:
        raise StoreConflict(
            f"run {current.id!r} is no longer {current.status.value}; it cannot become"
            f" {record.status.value} (another writer changed it first)"
        )


def _insert_values(record: RunRecord) -> tuple[Any, ...]:
    return (
        record.id,
        record.provider,
        record.prompt,
        record.conversation,
        record.agent,
        record.workspace,
        record.callback_url,
        # ASCII-escaped JSON: any string metadata can hold is storable.
        json.dumps(record.metadata, allow_nan=False),
        record.status.value,
        record.submitted_at,
        record.started_at,
        record.finished_at,
        record.account,
        record.exit_code,
        record.reason,
        record.result,
        record.session_id,
        record.excerpt,
        record.log_path,
        record.attempts,
        record.cwd,
    )


def _record(row: Sequence[Any]) -> RunRecord:
    (
        seq,
        run_id,
        provider,
        prompt,
        conversation,
        agent,
        workspace,
        callback_url,
        metadata,
        status,
        submitted_at,
        started_at,
        finished_at,
        account,
        exit_code,
        reason,
        result,
        session_id,
        excerpt,
        log_path,
        attempts,
        notes,
        cwd,
    ) = row
    return RunRecord(
        id=run_id,
        provider=provider,
        prompt=prompt,
        conversation=conversation,
        agent=agent,
        workspace=workspace,
        callback_url=callback_url,
        metadata=json.loads(metadata),
        seq=seq,
        status=RunStatus(status),
        submitted_at=submitted_at,
        started_at=started_at,
        finished_at=finished_at,
        account=account,
        exit_code=exit_code,
        reason=reason,
        result=result,
        session_id=session_id,
        excerpt=excerpt,
        log_path=log_path,
        attempts=attempts,
        notes=tuple(json.loads(notes)),
        cwd=cwd,
    )
