"""The ledger's schema, declared once: tables, columns, indexes and versions.

Both SQL stores render their DDL from :data:`SCHEMA`: a column or index
added here (with the version that adds it) is created in a new ledger and
added to an older one, on SQLite and on PostgreSQL alike. Nothing else
states the schema: the migrations are derived from the versions each part
was added in, and the shared queries
(:mod:`herdsman.runtime.store.queries`) take the runs table's columns from here.

A plain table of our own, not an ORM or a migration tool: the schema is
four small tables whose migrations only ever add (a table, a column, an
index), and the stores' queries are hand-written SQL whose every statement
and transaction boundary is chosen (see docs/store.md, "Schema versions").
"""

from __future__ import annotations

import enum
from collections.abc import Iterator

import attrs

__all__ = [
    "SCHEMA",
    "Column",
    "Dialect",
    "Index",
    "Schema",
    "Table",
    "Type",
]


class Dialect(enum.Enum):
    """A database herdsman keeps its ledger in."""

    SQLITE = "sqlite"
    POSTGRES = "postgresql"


class Type(enum.Enum):
    """A column's type, named for what it holds; each dialect spells it its own way."""

    #: Text, compared and sorted by code point (on PostgreSQL ``COLLATE "C"``,
    #: whatever locale the database was created with, as SQLite and Python do).
    TEXT = "text"
    #: Unix seconds and other floats.
    REAL = "real"
    INTEGER = "integer"
    #: An integer drawn from a 64-bit counter (SQLite's integers are all 64-bit).
    BIGINT = "bigint"
    #: The table's key, handed out by the database in increasing order and
    #: never reused, not even after the newest row was deleted.
    SERIAL = "serial"


_TYPES: dict[Dialect, dict[Type, str]] = {
    Dialect.SQLITE: {
        Type.TEXT: "TEXT",
        Type.REAL: "REAL",
        Type.INTEGER: "INTEGER",
        Type.BIGINT: "INTEGER",
        # AUTOINCREMENT, unlike a bare rowid, never reuses a value once the
        # newest row has been deleted.
        Type.SERIAL: "INTEGER PRIMARY KEY AUTOINCREMENT",
    },
    Dialect.POSTGRES: {
        Type.TEXT: 'TEXT COLLATE "C"',
        Type.REAL: "DOUBLE PRECISION",
        Type.INTEGER: "INTEGER",
        Type.BIGINT: "BIGINT",
        # An identity column never hands out a value twice.
        Type.SERIAL: "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    },
}

BOTH = frozenset(Dialect)


@attrs.frozen
class Column:
    """One column: its type, constraints and the schema version that added it.

    ``life``: a column of ``runs`` that a run's start, finish or re-queue
    writes again (the rest are written once, when the run is recorded).
    """

    name: str
    type: Type
    not_null: bool = False
    unique: bool = False
    #: The value of rows that predate the column, as an SQL literal.
    default: str | None = None
    #: The version that added it; ``None``: its table's.
    since: int | None = None
    life: bool = False

    def render(self, dialect: Dialect) -> str:
        """The column's definition in ``dialect``'s DDL."""
        parts = [self.name, _TYPES[dialect][self.type]]
        if self.not_null:
            parts.append("NOT NULL")
        if self.unique:
            parts.append("UNIQUE")
        if self.default is not None:
            parts.append(f"DEFAULT {self.default}")
        return " ".join(parts)


@attrs.frozen
class Index:
    """An index of a table, in the dialects that have it, from version ``since``.

    ``where`` makes it partial (plain SQL both dialects read alike);
    ``since`` ``None`` is its table's version.
    """

    name: str
    columns: tuple[str, ...]
    where: str | None = None
    since: int | None = None
    dialects: frozenset[Dialect] = BOTH

    def render(self, table: str) -> str:
        """``CREATE INDEX`` for this index of ``table``."""
        sql = f"CREATE INDEX {self.name} ON {table} ({', '.join(self.columns)})"
        return sql if self.where is None else f"{sql} WHERE {self.where}"


@attrs.frozen
class Table:
    """A table: its columns in order, its key, its indexes, and the version that added it.

    ``key``: the primary key's columns, unless a :attr:`Type.SERIAL` column
    is the key. A keyed table is ``WITHOUT ROWID`` on SQLite: its rows are
    stored in key order, which is how every such table is read.
    """

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] = ()
    indexes: tuple[Index, ...] = ()
    since: int = 1

    def column(self, name: str) -> Column:
        """The column called ``name``."""
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(f"table {self.name} has no column {name!r}")

    def since_of(self, part: Column | Index) -> int:
        """The version that added a column or index of this table."""
        return self.since if part.since is None else part.since

    def create(self, dialect: Dialect, version: int) -> str:
        """``CREATE TABLE`` with the columns it had at ``version``."""
        lines = [c.render(dialect) for c in self.columns if self.since_of(c) <= version]
        if self.key:
            lines.append(f"PRIMARY KEY ({', '.join(self.key)})")
        body = ",\n    ".join(lines)
        rowid = " WITHOUT ROWID" if self.key and dialect is Dialect.SQLITE else ""
        return f"CREATE TABLE {self.name} (\n    {body}\n){rowid}"


@attrs.frozen
class Schema:
    """The whole schema and its history: ``versions[i]`` says what version ``i + 1`` added.

    Every table, column and index names the version that added it; a version
    only adds, so the statements that take a ledger from one version to the
    next (:meth:`migrations`) follow from the declaration.
    """

    tables: tuple[Table, ...]
    versions: tuple[str, ...]

    def __attrs_post_init__(self) -> None:
        """Refuse a declaration no migration could carry out."""
        for table in self.tables:
            self._check_version(f"table {table.name}", table.since)
            for column in table.columns:
                since = table.since_of(column)
                self._check_version(f"{table.name}.{column.name}", since)
                if since < table.since:
                    raise ValueError(
                        f"column {table.name}.{column.name} is older than its table"
                        f" (version {since} < {table.since})"
                    )
                added = since > table.since
                if added and (column.unique or column.type is Type.SERIAL):
                    raise ValueError(
                        f"column {table.name}.{column.name} is added to an existing table, which"
                        " cannot take a UNIQUE or key column: make it part of a new table"
                    )
                if added and column.not_null and column.default is None:
                    raise ValueError(
                        f"column {table.name}.{column.name} is NOT NULL and added to an existing"
                        " table: give it a default, the value of the rows it finds there"
                    )
            for index in table.indexes:
                since = table.since_of(index)
                self._check_version(f"index {index.name}", since)
                for name in index.columns:
                    if table.since_of(table.column(name)) > since:
                        raise ValueError(
                            f"index {index.name} (version {since}) names column {name},"
                            f" added later (version {table.since_of(table.column(name))})"
                        )

    def _check_version(self, what: str, since: int) -> None:
        if not 1 <= since <= self.version:
            raise ValueError(
                f"{what} is said to be added in version {since}, but the schema's versions"
                f" are 1 to {self.version}: describe the new version in Schema.versions"
            )

    @property
    def version(self) -> int:
        """The schema version this code writes."""
        return len(self.versions)

    def table(self, name: str) -> Table:
        """The table called ``name``."""
        for table in self.tables:
            if table.name == name:
                return table
        raise KeyError(f"the schema has no table {name!r}")

    def migrations(self, dialect: Dialect) -> tuple[tuple[str, ...], ...]:
        """Entry ``i`` takes a ledger in ``dialect`` from version ``i`` to ``i + 1``."""
        return tuple(tuple(self._steps(dialect, version)) for version in range(1, self.version + 1))

    def _steps(self, dialect: Dialect, version: int) -> Iterator[str]:
        for table in self.tables:
            if table.since == version:
                yield table.create(dialect, version)
            elif table.since < version:
                for column in table.columns:
                    if table.since_of(column) == version:
                        yield f"ALTER TABLE {table.name} ADD COLUMN {column.render(dialect)}"
            for index in table.indexes:
                if table.since_of(index) == version and dialect in index.dialects:
                    yield index.render(table.name)


_LIVE = "status IN ('queued', 'running')"
# Fleet claims and polls only: a SQLite ledger serves one supervisor, and
# these would only cost each of its writes.
_POSTGRES = frozenset({Dialect.POSTGRES})

SCHEMA = Schema(
    versions=(
        "runs and conversation sessions",
        "runs.notes: a JSON list of notes on a run (add_note)",
        "runs.cwd: the working directory a run names",
        "the account tracker: a session's account, account_limits, runs by start",
        "fleet coordination: runs.held_by, supervisors (docs/fleet.md)",
        "fleet requests: runs.cancel_request, runs.requeue_mark (docs/fleet.md)",
        "a run's spend: tokens by kind, cost_usd, turns, api_time, models (docs/store.md)",
        "run_attempts: the earlier attempts of re-queued and retried runs (docs/store.md)",
        "run_attempts.held_by: the fleet member that ran each earlier attempt (docs/fleet.md)",
    ),
    tables=(
        Table(
            "runs",
            (
                # The record's columns (RunRecord's fields, by name) then the fleet's.
                Column("seq", Type.SERIAL),
                Column("id", Type.TEXT, not_null=True, unique=True),
                Column("provider", Type.TEXT, not_null=True),
                Column("prompt", Type.TEXT, not_null=True),
                Column("conversation", Type.TEXT),
                Column("agent", Type.TEXT),
                Column("workspace", Type.TEXT, not_null=True),
                Column("callback_url", Type.TEXT),
                # JSON of the run's metadata.
                Column("metadata", Type.TEXT, not_null=True),
                Column("status", Type.TEXT, not_null=True),
                Column("submitted_at", Type.REAL, not_null=True),
                Column("started_at", Type.REAL, life=True),
                Column("finished_at", Type.REAL, life=True),
                Column("account", Type.TEXT, life=True),
                Column("exit_code", Type.INTEGER, life=True),
                Column("reason", Type.TEXT, life=True),
                Column("result", Type.TEXT, life=True),
                Column("session_id", Type.TEXT, life=True),
                Column("excerpt", Type.TEXT, life=True),
                Column("log_path", Type.TEXT, life=True),
                Column("attempts", Type.INTEGER, not_null=True, life=True),
                Column("notes", Type.TEXT, not_null=True, default="'[]'", since=2),
                Column("cwd", Type.TEXT, since=3),
                # The fleet member (supervisors.id) that claimed a running run.
                Column("held_by", Type.TEXT, since=5),
                # Why a member asked the holder of this running run to cancel
                # it, read by the holder's poll (see fleet.py).
                Column("cancel_request", Type.TEXT, since=6),
                # Drawn from seq's counter when a member re-queues the run, so
                # the other members' polls, past its seq, see it again.
                Column("requeue_mark", Type.BIGINT, since=6),
                # What the run's last attempt spent (RunRecord.spend), written
                # at its finish: NULL where the stream said nothing. Each a
                # column, so a total is a plain SUM on both databases.
                Column("input_tokens", Type.BIGINT, since=7),
                Column("cache_read_tokens", Type.BIGINT, since=7),
                Column("cache_write_tokens", Type.BIGINT, since=7),
                Column("output_tokens", Type.BIGINT, since=7),
                Column("reasoning_tokens", Type.BIGINT, since=7),
                Column("cost_usd", Type.REAL, since=7),
                Column("turns", Type.INTEGER, since=7),
                # Seconds.
                Column("api_time", Type.REAL, since=7),
                # JSON of the per-model usage, a list sorted by model; NULL
                # exactly when the run has no spend (the marker of one). A
                # JSON column, not a table: it is read only with its run, or
                # summed by `herdsman usage --by model` while that reads the
                # runs anyway, and a table would cost every finish an insert
                # per model and every prune and re-queue a delete.
                Column("models", Type.TEXT, since=7),
            ),
            indexes=(
                # queued_in_order, recover, list_runs(status=...), counts.
                Index("runs_by_status", ("status", "seq")),
                Index("runs_by_provider", ("provider", "seq")),
                Index("runs_by_conversation", ("conversation", "seq")),
                Index("runs_by_workspace", ("workspace", "seq")),
                # prune
                Index("runs_by_finished_at", ("finished_at",)),
                # account_usage: a range on started_at instead of a table scan.
                Index("runs_by_started_at", ("started_at",), since=4),
                # A claim looks for a running or earlier queued run on its
                # lanes: with these, it reads only that lane's live runs,
                # however long the queue and however many finished runs the
                # conversation has.
                Index(
                    "runs_live_by_conversation",
                    ("workspace", "conversation", "seq"),
                    where=_LIVE,
                    since=5,
                    dialects=_POSTGRES,
                ),
                Index(
                    "runs_live_by_agent",
                    ("workspace", "agent", "seq"),
                    where=_LIVE,
                    since=5,
                    dialects=_POSTGRES,
                ),
                Index(
                    "runs_by_held_by",
                    ("held_by",),
                    where="status = 'running'",
                    since=5,
                    dialects=_POSTGRES,
                ),
                Index(
                    "runs_queued_by_requeue_mark",
                    ("requeue_mark",),
                    where="status = 'queued' AND requeue_mark IS NOT NULL",
                    since=6,
                    dialects=_POSTGRES,
                ),
            ),
        ),
        Table(
            "conversation_sessions",
            (
                Column("provider", Type.TEXT, not_null=True),
                Column("workspace", Type.TEXT, not_null=True),
                Column("conversation", Type.TEXT, not_null=True),
                Column("session_id", Type.TEXT, not_null=True),
                # The account whose config directory holds the session; NULL
                # is the ambient environment, which is also what every older
                # row was.
                Column("account", Type.TEXT, since=4),
            ),
            key=("provider", "workspace", "conversation"),
        ),
        Table(
            "account_limits",
            (
                Column("provider", Type.TEXT, not_null=True),
                # '' for the ambient environment, not NULL: NULLs are all
                # distinct in a primary key, so NULL would allow duplicates.
                Column("account", Type.TEXT, not_null=True),
                Column("until", Type.REAL, not_null=True),
                Column("message", Type.TEXT, not_null=True),
            ),
            key=("provider", "account"),
            since=4,
        ),
        Table(
            "supervisors",
            (
                Column("id", Type.TEXT),
                Column("host", Type.TEXT, not_null=True),
                Column("pid", Type.INTEGER, not_null=True),
                # The database server's clock (unix seconds): the one clock
                # every member of a fleet shares (see fleet.py).
                Column("joined_at", Type.REAL, not_null=True),
                Column("lease_until", Type.REAL, not_null=True),
            ),
            key=("id",),
            since=5,
        ),
        Table(
            "run_attempts",
            (
                # An earlier attempt of a run that went back to the queue (a
                # usage limit's re-queue, a retry), kept as it ended: the
                # run's own row then holds only its newest attempt.
                Column("run_id", Type.TEXT, not_null=True),
                Column("attempt", Type.INTEGER, not_null=True),
                Column("status", Type.TEXT, not_null=True),
                Column("account", Type.TEXT),
                Column("started_at", Type.REAL),
                Column("finished_at", Type.REAL),
                Column("exit_code", Type.INTEGER),
                Column("reason", Type.TEXT),
                # The failure class a retry was made for; NULL: a usage limit.
                Column("failure", Type.TEXT),
                Column("retry_at", Type.REAL),
                # What the attempt spent, as the runs table's spend columns.
                Column("input_tokens", Type.BIGINT),
                Column("cache_read_tokens", Type.BIGINT),
                Column("cache_write_tokens", Type.BIGINT),
                Column("output_tokens", Type.BIGINT),
                Column("reasoning_tokens", Type.BIGINT),
                Column("cost_usd", Type.REAL),
                Column("turns", Type.INTEGER),
                Column("api_time", Type.REAL),
                Column("models", Type.TEXT),
                # The fleet member (supervisors.id) that held the run for this
                # attempt, as runs.held_by held it; NULL: a supervisor that
                # held the ledger alone, or an attempt kept before version 9.
                Column("held_by", Type.TEXT, since=9),
            ),
            key=("run_id", "attempt"),
            since=8,
        ),
    ),
)
"""The ledger's schema (see docs/store.md, "Schema versions")."""
