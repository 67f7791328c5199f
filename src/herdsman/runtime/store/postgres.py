"""The PostgreSQL store: the run ledger on a database server (``[store] url``).

The same queries and rules as the SQLite store (both are
:class:`~herdsman.runtime.store.sql.SqlStore`); this module brings the
connection, the schema and its migrations.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import outcome
import psycopg
import psycopg.sql
from psycopg.pq import TransactionStatus

from herdsman.postgres_url import hide_password, parse_postgres_url, server_name
from herdsman.runtime.store.errors import (
    CommitOutcomeUnknown,
    ConnectionLost,
    LedgerNotCurrent,
    StoreError,
)
from herdsman.runtime.store.queries import Cursor
from herdsman.runtime.store.schema import SCHEMA, Dialect
from herdsman.runtime.store.sql import SqlStore

if TYPE_CHECKING:
    from herdsman.runtime.store.base import Store

log = logging.getLogger("herdsman.store")

#: Entry i migrates the schema from version i to i + 1, rendered from the one
#: declaration of the schema, as the SQLite store's: a version number means
#: the same tables on both.
MIGRATIONS: tuple[tuple[str, ...], ...] = SCHEMA.migrations(Dialect.POSTGRES)

SCHEMA_VERSION = SCHEMA.version
"""The schema version this code writes; a database with a higher version is refused."""

# Serialises supervisors that create or migrate the same database at once;
# any constant works, this one spells "herdsman" in ASCII.
_MIGRATION_LOCK = 0x68657264736D616E

#: With the schema's oid in the low 32 bits: the key of the sole-supervisor
#: lock (see PostgresStore._claim), which fleet members hold shared. "hrdm" in ASCII.
SOLE_SUPERVISOR_LOCK = 0x6872646D

#: After a failed attempt to reconnect, no call tries again for this long
#: (seconds); each failure in a row doubles it, up to RECONNECT_MAX_WAIT. A
#: server that is down refuses at once, but an unreachable one holds every
#: attempt for the connect timeout: without a pause, each ledger call would.
RECONNECT_FIRST_WAIT = 0.5
RECONNECT_MAX_WAIT = 30.0

# The version lives in a one-row table beside the ledger's tables (in the
# first schema of the search_path), written in the migration's transaction.
_VERSION_TABLE = "herdsman_schema"


@functools.lru_cache(maxsize=256)
def _placeholders(sql: str) -> str:
    """The shared queries' ``?`` placeholders as psycopg's ``%s``."""
    return sql.replace("?", "%s")


class _QmarkCursor:
    """A psycopg cursor that takes the ``?`` placeholders the shared queries use."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> _QmarkCursor:
        self._cur.execute(_placeholders(sql), params)
        return self

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur)

    def close(self) -> None:
        self._cur.close()


class PostgresStore(SqlStore):
    """A :class:`~herdsman.runtime.store.base.Store` in a PostgreSQL database.

    ``url`` is a libpq URL (``postgresql://user@host:port/dbname?...``); a
    password may come from it, ``PGPASSWORD`` or ``~/.pgpass``. The tables
    go in the first schema of the connection's ``search_path`` (normally
    ``public``). Every commit is synchronous (``synchronous_commit = on``),
    so a run recorded as started stays started after a server crash.
    """

    _driver_errors = (psycopg.Error,)

    def __init__(
        self, url: str, *, connect_timeout: int = 10, sole: bool = False, upgrade: bool = True
    ) -> None:
        """Connect, then create or migrate the schema.

        ``connect_timeout`` (seconds) applies unless the URL sets its own.
        ``sole``: this is the one supervisor of this ledger; refuse to open
        while another holds it (see :meth:`_claim`). ``upgrade`` False: a
        schema at another version (or none) is left as it is and
        :class:`LedgerNotCurrent` raised (for commands that only read). Raises
        :class:`StoreError` naming the server (never the password) if the
        server cannot be reached, the schema is newer than this code, or the
        ledger is held.
        """
        super().__init__()
        try:
            params = parse_postgres_url(url)
        except ValueError as exc:
            raise StoreError(f"the PostgreSQL store URL {exc}") from None
        self.server = server_name(params)
        self._url = url
        self._password = params.get("password")
        self._sole = sole
        self._upgrade = upgrade
        extra: dict[str, Any] = {"fallback_application_name": "herdsman"}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = connect_timeout
        self._connect_options = extra
        # Reconnecting (see _ensure_connected): the clock its pauses are
        # measured on, when the next attempt may be made, the pause after
        # the next failure, and why the last attempt failed.
        self._monotonic: Callable[[], float] = time.monotonic
        self._next_attempt = 0.0
        self._reconnect_wait = RECONNECT_FIRST_WAIT
        self._reconnect_failure = ""
        self._schema: str | None = None
        self._session: tuple[int, Any] | None = None
        try:
            self._conn = self._connect()
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot connect to the run ledger on {self.server}: {self._hide(exc)}"
            ) from None
        try:
            self._settle_session()
            # Claimed before anything is read or migrated: a newer herdsman
            # refused here must not have upgraded the schema of the ledger
            # another supervisor is using.
            self._take_ledger(sole)
            self._open()
        except BaseException:
            self._conn.close()
            self._closed = True
            raise

    def _connect(self) -> psycopg.Connection[Any]:
        # autocommit: no implicit transactions; we issue BEGIN/COMMIT
        # ourselves (as the SQLite store does) so each change is exactly one.
        return psycopg.connect(self._url, autocommit=True, **self._connect_options)

    def _take_ledger(self, sole: bool) -> None:
        """Hold the ledger as this kind of store does, before the schema is touched."""
        if sole:
            self._claim()

    def _hide(self, exc: BaseException) -> str:
        """The driver's message on one line (libpq's span several), without the password."""
        lines = (line.strip() for line in str(exc).splitlines())
        return hide_password("; ".join(line for line in lines if line), self._url, self._password)

    def _message(self, exc: BaseException) -> str:
        return self._hide(exc)

    def _settle_session(self) -> None:
        """Settings that must not depend on the server's, the role's or the URL's."""
        try:
            # Durability of a start must not depend on the server's default.
            self._conn.execute("SET synchronous_commit = on")
            # Times are floats: all their digits, whatever the server prints by default.
            self._conn.execute("SET extra_float_digits = 3")
            # Text comes back as text even from a SQL_ASCII database.
            self._conn.execute("SET client_encoding = 'UTF8'")
            # One schema: the one the lock below is keyed by is the one the
            # tables are looked up and made in (a search_path of several
            # could find them in another schema, held by another supervisor).
            row = self._conn.execute("SELECT current_schema()").fetchone()
            if row is None or row[0] is None:
                raise StoreError(
                    f"the run ledger on {self.server} has no schema to live in: the"
                    " search_path names none that exists (set one, or create it)"
                )
            if self._schema is not None and row[0] != self._schema:
                # Reconnected: the URL's search_path now finds another schema
                # (one created since): the ledger is the one opened at start.
                raise StoreError(
                    f"the run ledger on {self.server} was in schema {self._schema!r}, but the"
                    f" connection made again finds schema {row[0]!r} first: restart the"
                    " supervisor (or drop the schema created since)"
                )
            self._schema = row[0]
            # This session, as the server knows it: a later connection ends it
            # should it outlive its client (see _end_old_session).
            session = self._conn.execute(
                "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            ).fetchone()
            self._session = None if session is None else (session[0], session[1])
            self._conn.execute(
                psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(row[0]))
            )
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot prepare the run ledger on {self.server}: {self._hide(exc)}"
            ) from None

    def _open(self) -> None:
        try:
            # Check the version before writing anything: a newer herdsman's
            # schema must be left exactly as it is.
            version = self._version()
            self._check_version(version)
            if version != SCHEMA_VERSION:
                if not self._upgrade:
                    raise LedgerNotCurrent(f"on {self.server}", version, SCHEMA_VERSION)
                self._migrate()
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot prepare the run ledger on {self.server}: {self._hide(exc)}"
            ) from None

    def _claim(self) -> None:
        """Hold the ledger for this supervisor while the connection lasts.

        Two supervisors on one ledger would each take the other's running
        runs for lost and schedule the same queue: that needs fleet
        coordination, which herdsman does not have yet. The lock is the
        state directory's lock file, for a ledger on a server: a session
        advisory lock keyed by the schema's oid (unique in the database),
        released by the server when the connection ends, however it ends.
        """
        try:
            row = self._conn.execute(
                "SELECT pg_try_advisory_lock((%s::bigint << 32) | oid::bigint), nspname"
                " FROM pg_namespace WHERE nspname = current_schema()",
                (SOLE_SUPERVISOR_LOCK,),
            ).fetchone()
        except psycopg.Error as exc:
            raise self._failure(exc) from None
        if row is None or not row[0]:
            schema = "?" if row is None else row[1]
            raise StoreError(
                f"another herdsman supervisor is using the run ledger on {self.server}"
                f" (schema {schema!r}); one ledger serves one supervisor until fleet"
                " coordination exists (docs/fleet.md): stop the other supervisor, or point"
                " [store] url at another database or schema"
            )

    def _version(self) -> int:
        found = self._conn.execute("SELECT to_regclass(%s)", (_VERSION_TABLE,)).fetchone()
        if found is None or found[0] is None:
            return 0
        row = self._conn.execute(f"SELECT max(version) FROM {_VERSION_TABLE}").fetchone()
        return 0 if row is None or row[0] is None else int(row[0])

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the run ledger on {self.server} has schema version {version}, newer than"
                f" this herdsman understands ({SCHEMA_VERSION}); it was written by a newer"
                " herdsman: upgrade herdsman, or point [store] url at another database"
            )

    def _migrate(self) -> None:
        # A session lock, taken before the transaction: a transaction that
        # waited for a lock inside itself could still read the catalog as it
        # was before the wait, miss the tables the other supervisor made
        # meanwhile and try to make them again.
        self._conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            with self._transaction() as cur:
                # Read again under the lock: another supervisor may have
                # migrated the database between our first look and now.
                version = self._version()
                self._check_version(version)
                for statements in MIGRATIONS[version:]:
                    for statement in statements:
                        cur.execute(statement)
                # DDL is transactional here: the schema and its version commit together.
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {_VERSION_TABLE} (version INTEGER NOT NULL)"
                )
                cur.execute(f"DELETE FROM {_VERSION_TABLE}")
                cur.execute(f"INSERT INTO {_VERSION_TABLE} (version) VALUES (?)", (SCHEMA_VERSION,))
        finally:
            # A lost connection has released the lock already.
            if not self._conn.broken:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))

    @property
    def schema_version(self) -> int:
        """The schema version of the database."""
        with self._reading():
            return self._version()

    def _describe(self) -> str:
        return f"run ledger on {self.server}"

    def _cursor(self) -> Cursor:
        return _QmarkCursor(self._conn.cursor())

    def _begin(self, cur: Cursor, durable: bool) -> None:
        # Every commit is synchronous (see _open), so durable needs nothing more.
        cur.execute("BEGIN")

    def _transaction_aborted(self) -> bool:
        return self._conn.info.transaction_status is TransactionStatus.INERROR

    def _in_transaction(self) -> bool:
        # UNKNOWN: the connection is gone, and with it the transaction.
        return self._conn.info.transaction_status in (
            TransactionStatus.INTRANS,
            TransactionStatus.INERROR,
        )

    def _connection_lost(self) -> bool:
        # psycopg marks a connection closed when the server or network dropped it.
        return self._conn.closed and not self._closed

    def _close_connection(self) -> None:
        self._conn.close()

    # --- reconnecting ---------------------------------------------------------

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        """See :meth:`Store.apply`; a batch the connection broke under is applied once more.

        Only when the connection broke before the batch's COMMIT was sent:
        the server then rolled back the whole transaction with the
        connection, so nothing of it was recorded, and applying it again on
        a new connection records it once. A batch whose COMMIT was sent
        (:class:`CommitOutcomeUnknown`: it may have been recorded) is never
        applied again, and neither is one that began on a connection
        already known lost (its reconnect was the new try, and failed).
        """
        with self._lock:
            was_open = not self._conn.closed
            try:
                return super().apply(operations, durable=durable)
            except CommitOutcomeUnknown:
                raise
            except StoreError as exc:
                # Whatever the error says (an undo that failed on the dead
                # connection is a plain StoreError), a connection lost during
                # this batch, before its COMMIT, left nothing of it recorded.
                if not (was_open and self._connection_lost()):
                    raise
                log.warning("%s; applying the batch again on a new connection", exc)
            return super().apply(operations, durable=durable)

    def _ensure_connected(self) -> None:
        """Connect again if the connection was lost: at once, then with pauses while it fails.

        A connection made again is set up as the first was (session
        settings, the same schema, the sole-supervisor or fleet lock, the
        schema version this code writes); should any of that fail, it is
        closed and the store stays disconnected. Raises
        :class:`ConnectionLost` while the server cannot be reached (saying
        when the next attempt is due), and the refusal itself otherwise
        (another supervisor took the ledger meanwhile, the schema changed).
        """
        if not self._conn.closed:
            return
        wait = self._next_attempt - self._monotonic()
        if wait > 0:
            raise self._unreachable(wait)
        try:
            self._reconnect()
        except (StoreError, psycopg.Error) as exc:
            failure = self._hide(exc) if isinstance(exc, psycopg.Error) else str(exc)
            self._reconnect_failure = failure
            wait = self._reconnect_wait
            self._next_attempt = self._monotonic() + wait
            self._reconnect_wait = min(wait * 2, RECONNECT_MAX_WAIT)
            log.warning("cannot reconnect to the %s: %s", self._describe(), failure)
            if isinstance(exc, StoreError) and not isinstance(exc, ConnectionLost):
                raise  # a refusal: it says what is wrong
            raise self._unreachable(wait) from exc
        self._next_attempt, self._reconnect_wait = 0.0, RECONNECT_FIRST_WAIT
        log.warning("reconnected to the %s", self._describe())

    def _unreachable(self, wait: float) -> ConnectionLost:
        """The error of a call while the server cannot be reached, ``wait`` s before a retry."""
        return ConnectionLost(
            f"{self._describe()}: the connection was lost, and connecting again"
            f" failed ({self._reconnect_failure}); the next attempt is made in"
            f" {wait:.1f} s, at the first call after that"
        )

    def _end_old_session(self, session: tuple[int, Any] | None) -> None:
        """End the lost connection's session on the server, if it lives on, and wait for it.

        After a network cut the server may not notice for minutes (until
        its TCP keepalive gives up): the session would keep the sole-
        supervisor lock (this supervisor would be refused as "another"), and
        any row locks of a transaction it had open. Matched by its start
        time too, so a new session that got its pid is never touched.
        """
        if session is None:
            return
        self._conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE pid = %s AND backend_start = %s",
            session,
        )

    def _check_same_version(self) -> None:
        version = self._version()
        if version != SCHEMA_VERSION:
            # Another herdsman migrated it meanwhile (or it was restored
            # from an older backup): this code's queries may not fit.
            raise StoreError(
                f"the run ledger on {self.server} has schema version {version} since the"
                f" connection was lost, not {SCHEMA_VERSION} as this herdsman writes:"
                " restart the supervisor"
            )

    def _reconnect(self) -> None:
        """A new connection in place of the lost one, set up as at start, or an error."""
        old_session = self._session
        self._conn = self._connect()
        try:
            self._settle_session()
            self._end_old_session(old_session)
            # The lock went with the old session: another supervisor may
            # have taken the ledger since (it is refused then).
            self._take_ledger(self._sole)
            self._check_same_version()
        except BaseException:
            self._conn.close()
            # The old session is still the one to end should it live on.
            self._session = old_session
            raise
