"""The SQLite store: the default, single-machine run ledger (one file, WAL mode)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from herdsman.runtime.state_paths import private_opener
from herdsman.runtime.store.errors import LedgerNotCurrent, StoreError
from herdsman.runtime.store.queries import Cursor
from herdsman.runtime.store.schema import SCHEMA, Dialect
from herdsman.runtime.store.sql import SqlStore

#: Entry i migrates the schema from version i to i + 1; the file's version
#: is PRAGMA user_version. Rendered from the one declaration of the schema.
MIGRATIONS: tuple[tuple[str, ...], ...] = SCHEMA.migrations(Dialect.SQLITE)

SCHEMA_VERSION = SCHEMA.version
"""The schema version this code writes; files with a higher version are refused."""

#: The files SQLite keeps beside the ledger (WAL mode, and a rollback journal).
SIDE_FILES = ("-wal", "-shm", "-journal")


def _private_ledger(path: Path) -> None:
    """Make the ledger (prompts and results) private before SQLite opens it.

    SQLite creates the file ``0644`` (less the umask) and gives its ``-wal``
    and ``-shm`` files the database's own mode; so the file is created here
    first, ``0600``, and an older herdsman's readable files are tightened.
    A link at the ledger or a side file is refused, not followed; one
    planted between this look and SQLite's own open is not caught (SQLite
    opens by path).
    """
    sides = [path.with_name(path.name + side) for side in SIDE_FILES]
    for file in (path, *sides):
        if file.is_symlink():
            raise StoreError(
                f"cannot open the run ledger {str(path)!r}: {str(file)!r} is a symbolic link;"
                " herdsman never opens its ledger through one (replace it with the file)"
            )
    try:
        os.close(private_opener(str(path), os.O_RDWR | os.O_CREAT))
        for side in sides:
            if side.exists():
                os.close(private_opener(str(side), os.O_RDWR))
    except OSError as exc:
        raise StoreError(f"cannot open the run ledger {str(path)!r}: {exc.strerror}") from exc


class SqliteStore(SqlStore):
    """A :class:`~herdsman.runtime.store.base.Store` in one SQLite file.

    Safe to call from ``trio.to_thread`` worker threads. Several processes
    may open the same file; every state change is one ``BEGIN IMMEDIATE``
    transaction.
    """

    _driver_errors = (sqlite3.Error,)

    def __init__(self, path: Path, *, busy_timeout: float = 10.0, upgrade: bool = True) -> None:
        """Open (creating if needed) the ledger at ``path`` and bring its schema up to date.

        ``busy_timeout`` is how long, in seconds, a write waits for another
        process holding the file's write lock before failing. ``upgrade``
        False: a ledger at another schema version is left as it is and
        :class:`LedgerNotCurrent` raised (for commands that only read).
        """
        super().__init__()
        self.path = path
        self._upgrade = upgrade
        _private_ledger(path)
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
            version = self._user_version()
            self._check_version(version)
            if not self._upgrade and version != SCHEMA_VERSION:
                raise LedgerNotCurrent(repr(str(self.path)), version, SCHEMA_VERSION)
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

    def _describe(self) -> str:
        return f"run ledger {str(self.path)!r}"

    def _cursor(self) -> Cursor:
        return self._conn.cursor()

    def _begin(self, cur: Cursor, durable: bool) -> None:
        """``durable`` commits with ``synchronous=FULL``: on disk when it returns,
        together with every commit before it."""
        wanted = "FULL" if durable else "NORMAL"
        if self._synchronous != wanted:
            # Only allowed between transactions, which is where we are.
            cur.execute(f"PRAGMA synchronous = {wanted}")
            self._synchronous = wanted
        # IMMEDIATE takes the write lock up front, so a transaction that
        # read a status cannot later fail to upgrade to writing.
        cur.execute("BEGIN IMMEDIATE")

    def _in_transaction(self) -> bool:
        return self._conn.in_transaction

    def _close_connection(self) -> None:
        self._conn.close()
