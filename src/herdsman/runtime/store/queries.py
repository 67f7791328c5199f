"""The SQL both ledger stores share: runs as rows, and the queries built on them.

:class:`~herdsman.runtime.store.sql.SqlStore` (SQLite and PostgreSQL) and
:class:`~herdsman.runtime.store.fleet.FleetStore` read, insert and update
runs through these. The runs table's columns come from the one declaration
of the schema (:data:`~herdsman.runtime.store.schema.SCHEMA`): a column
named like a :class:`RunRecord` field is read into the record and inserted
with it, and one marked ``life`` is written again as the run starts, ends
or is re-queued. Statements use ``?`` placeholders (the PostgreSQL store
turns them into psycopg's) and SQL both databases run alike.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import attrs

from herdsman.runtime.runner.run_usage import ModelUsage, Tokens
from herdsman.runtime.store.errors import StoreConflict
from herdsman.runtime.store.records import (
    Attempt,
    NewRun,
    RunRecord,
    RunStatus,
    Spend,
    new_record,
    not_found,
)
from herdsman.runtime.store.schema import SCHEMA

__all__ = [
    "ACCOUNT_USAGE",
    "ACCOUNT_USAGE_EARLIER",
    "ACCOUNT_USAGE_EARLIER_COLUMNS",
    "ACCOUNT_USAGE_EARLIER_FROM",
    "ACCOUNT_USAGE_WHERE",
    "BUDGET_TOKENS",
    "CHARGED",
    "CHARGED_END",
    "INSERT_ATTEMPT",
    "LIFE_COLUMNS",
    "PRUNE_ATTEMPTS",
    "RECORD_NAMES",
    "RUN_COLUMNS",
    "SELECT_ATTEMPTS",
    "SELECT_RUNS",
    "SPEND_COLUMNS",
    "Cursor",
    "attempt_from_row",
    "attempt_values",
    "check_updated",
    "existing_run",
    "fetch_run",
    "insert_new",
    "life_values",
    "limit_key",
    "run_from_row",
    "spend_from_row",
    "spend_values",
    "unstorable",
    "update_life",
    "update_run",
]


class Cursor(Protocol):
    """What the shared queries need of a DB-API cursor (``?`` placeholders)."""

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed."""
        ...

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Any:
        """Run one statement."""
        ...

    def fetchone(self) -> Any:
        """The next row, or ``None``."""
        ...

    def fetchall(self) -> list[Any]:
        """Every remaining row."""
        ...

    def __iter__(self) -> Iterator[Any]:
        """The remaining rows."""
        ...

    def close(self) -> None:
        """Release the cursor."""
        ...


_RUNS = SCHEMA.table("runs")
_FIELDS = attrs.fields_dict(RunRecord)

#: The columns that hold a record's :class:`Spend` (``RunRecord.spend``), in
#: :func:`spend_values`' order: tokens by kind, cost, turns, API time, models.
SPEND_COLUMNS: tuple[str, ...] = tuple(
    _RUNS.column(name).name
    for name in (
        "input_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "output_tokens",
        "reasoning_tokens",
        "cost_usd",
        "turns",
        "api_time",
        "models",
    )
)
#: The runs table's columns a :class:`RunRecord` holds by name, in the table's order.
RECORD_NAMES: tuple[str, ...] = tuple(c.name for c in _RUNS.columns if c.name in _FIELDS)
#: :data:`RECORD_NAMES` then :data:`SPEND_COLUMNS` as a select list
#: (:func:`run_from_row` reads a row of them).
RUN_COLUMNS = ", ".join((*RECORD_NAMES, *SPEND_COLUMNS))
#: A run's record columns, for a ``WHERE`` / ``ORDER BY`` to follow.
SELECT_RUNS = f"SELECT {RUN_COLUMNS} FROM runs"
#: What a run's start, finish or re-queue writes, after its status, in the
#: table's order (and the spend columns after them: see :func:`update_life`).
LIFE_COLUMNS: tuple[str, ...] = tuple(c.name for c in _RUNS.columns if c.life)

# seq is the database's to hand out.
_INSERTED = tuple(name for name in RECORD_NAMES if name != "seq")
# ON CONFLICT: another process may insert the same id between our look and
# our insert; then nothing is inserted and the existing run is returned.
_INSERT = (
    f"INSERT INTO runs ({', '.join(_INSERTED)}) VALUES ({', '.join('?' * len(_INSERTED))})"
    " ON CONFLICT (id) DO NOTHING RETURNING seq"
)
_LIFE = operator.attrgetter(*LIFE_COLUMNS)


def update_life(*also: str) -> str:
    """The update of a run's status, every life column and ``also``, guarded by its status.

    Parameters: :func:`life_values`, a value for each of ``also``, the run's
    id and the status it was read with. The status in the ``WHERE`` clause
    is the one read in the same transaction: if anything else moved the run
    meanwhile, no row matches and :func:`check_updated` refuses the change,
    so two writers can never both win.
    """
    sets = ", ".join(f"{name} = ?" for name in ("status", *LIFE_COLUMNS, *SPEND_COLUMNS, *also))
    return f"UPDATE runs SET {sets} WHERE id = ? AND status = ?"


def life_values(record: RunRecord) -> tuple[Any, ...]:
    """The values of :func:`update_life`'s ``SET`` clause (before ``also``'s), in its order."""
    return (record.status.value, *_LIFE(record), *spend_values(record.spend))


_NO_SPEND = (None,) * len(SPEND_COLUMNS)
_NO_TOKENS = (None,) * 5


def spend_values(spend: Spend | None) -> tuple[Any, ...]:
    """``spend`` as the values of :data:`SPEND_COLUMNS`; all NULL for none."""
    if spend is None:
        return _NO_SPEND
    tokens = spend.tokens
    counts = (
        _NO_TOKENS
        if tokens is None
        else (tokens.input, tokens.cache_read, tokens.cache_write, tokens.output, tokens.reasoning)
    )
    models = json.dumps(
        [
            {
                "model": model.model,
                "input": model.tokens.input,
                "cache_read": model.tokens.cache_read,
                "cache_write": model.tokens.cache_write,
                "output": model.tokens.output,
                "reasoning": model.tokens.reasoning,
                "cost_usd": model.cost_usd,
            }
            for model in spend.models
        ]
    )
    return (*counts, spend.cost_usd, spend.turns, spend.api_time, models)


def spend_from_row(values: Sequence[Any]) -> Spend | None:
    """The :class:`Spend` held by a row's :data:`SPEND_COLUMNS`; None where ``models`` is NULL."""
    *counts, cost, turns, api_time, models = values
    if models is None:
        return None
    return Spend(
        # int(): PostgreSQL's BIGINT sums and reads back as int, as SQLite's do.
        tokens=None if counts[0] is None else Tokens(*(int(count) for count in counts)),
        cost_usd=None if cost is None else float(cost),
        models=tuple(
            ModelUsage(
                entry["model"],
                Tokens(
                    entry["input"],
                    entry["cache_read"],
                    entry["cache_write"],
                    entry["output"],
                    entry["reasoning"],
                ),
                entry["cost_usd"],
            )
            for entry in json.loads(models)
        ),
        turns=turns,
        api_time=None if api_time is None else float(api_time),
    )


# Each OR term has its own index (runs_by_started_at, runs_by_finished_at,
# runs_by_status), so SQLite can union three index lookups.
ACCOUNT_USAGE_WHERE = (
    " WHERE account IS NOT NULL AND started_at IS NOT NULL"
    " AND (started_at >= ? OR finished_at >= ? OR status = ?)"
    # Ended without an exit code and not lost: never spawned, spent nothing.
    " AND (exit_code IS NOT NULL OR status IN (?, ?))"
)
"""Which runs count for quota windows reaching back to a time (``account_usage``).

Parameters: since, since, running, running, lost.
"""

BUDGET_TOKENS = "input_tokens + cache_write_tokens + output_tokens"
"""The tokens a ``tokens`` budget counts, as SQL (``Tokens.budgeted``; NULL: no counts)."""

CHARGED = ", " + BUDGET_TOKENS + ", cost_usd"
"""What a run spent, for ``tokens`` and ``usd`` budgets: ``AccountUse``'s last two columns."""

CHARGED_END = " CASE WHEN status = ? THEN started_at ELSE finished_at END"
"""The end a run is charged to (parameter: lost).

A lost run's real end is unknown, and charging it the outage would block its
account long after: its use ends when it started.
"""

# The unary + in ORDER BY keeps SQLite from walking all of
# runs_by_started_at just to skip sorting the few rows found.
ACCOUNT_USAGE = (
    "SELECT provider, account, started_at,"
    + CHARGED_END
    + CHARGED
    + " FROM runs"
    + ACCOUNT_USAGE_WHERE
    + " ORDER BY +started_at, seq"
)
"""``account_usage``'s rows; parameters: lost, then :data:`ACCOUNT_USAGE_WHERE`'s."""

ACCOUNT_USAGE_EARLIER_COLUMNS = (
    "r.provider, a.account, a.started_at,"
    " CASE WHEN a.status = ? THEN a.started_at ELSE a.finished_at END,"
    # An attempt moved off its account (failure NULL: a usage limit, a
    # refused login) is charged no spend, as the running book charges it.
    " CASE WHEN a.failure IS NULL THEN NULL ELSE "
    # BUDGET_TOKENS, of the attempt's own columns.
    + " + ".join("a." + column for column in BUDGET_TOKENS.split(" + "))
    + " END, CASE WHEN a.failure IS NULL THEN NULL ELSE a.cost_usd END"
)
"""An earlier attempt's :class:`AccountUse` columns (parameter: lost)."""

ACCOUNT_USAGE_EARLIER_FROM = (
    " FROM run_attempts a JOIN runs r ON r.id = a.run_id"
    " WHERE a.account IS NOT NULL AND a.started_at IS NOT NULL"
    " AND (a.started_at >= ? OR a.finished_at >= ?)"
    # As the runs' own rows, a retried attempt that got no process spent
    # nothing; a moved one counts as the running book counts it, a start.
    " AND (a.exit_code IS NOT NULL OR a.status = ? OR a.failure IS NULL)"
    " ORDER BY a.started_at, r.seq, a.attempt"
)
"""Which earlier attempts count since a moment, in order (parameters: since, since, lost).

An earlier attempt has ended: it counts if it started or finished at or after ``since``.
"""

ACCOUNT_USAGE_EARLIER = "SELECT " + ACCOUNT_USAGE_EARLIER_COLUMNS + ACCOUNT_USAGE_EARLIER_FROM
"""``account_usage``'s earlier attempts (run_attempts), each under its own account.

Parameters: lost, since, since, lost.
"""


def limit_key(account: str | None) -> str:
    """``account`` as the account_limits table keys it: ambient (``None``) is ``''``."""
    return "" if account is None else account


def unstorable(key: object) -> bool:
    """Whether no stored key can equal ``key``.

    Every store refuses NUL on the way in, and PostgreSQL would fail a query
    that holds one instead of finding nothing.
    """
    return isinstance(key, str) and "\0" in key


def fetch_run(cur: Cursor, run_id: str) -> RunRecord | None:
    """The run ``run_id`` as this transaction sees it, or ``None``."""
    if unstorable(run_id):
        return None
    row = cur.execute(f"{SELECT_RUNS} WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else run_from_row(row)


def existing_run(cur: Cursor, run_id: str) -> RunRecord:
    """The run ``run_id``; :class:`RunNotFound` if the ledger does not hold it."""
    record = fetch_run(cur, run_id)
    if record is None:
        raise not_found(run_id)
    return record


def insert_new(
    cur: Cursor, new: NewRun, now: float, status: RunStatus, reason: str | None
) -> tuple[RunRecord, bool]:
    """Insert ``new`` as a run ``status``; the existing run if its id was taken meanwhile."""
    record = new_record(new, 0, now, status, reason)
    row = cur.execute(_INSERT, _insert_values(record)).fetchone()
    if row is None:  # another process inserted it since we looked
        return existing_run(cur, new.id), False
    return attrs.evolve(record, seq=row[0]), True


def update_run(cur: Cursor, current: RunRecord, record: RunRecord) -> None:
    """Write ``record`` over ``current``: its status and the life columns that changed.

    As :func:`update_life` would, guarded the same way, but a column left
    out of the SET clause leaves its indexes alone: a start then does not
    touch ``runs_by_finished_at``, nor a finish ``runs_by_started_at``, which
    took about 40% off an update's cost in SQLite. (The other columns hold
    ``current``'s values: this transaction read them, and SQLite's write
    lock or, in PostgreSQL, the status guard keeps them so.)
    """
    changed = [
        (name, value)
        for name, before, value in zip(LIFE_COLUMNS, _LIFE(current), _LIFE(record), strict=True)
        if value != before or type(value) is not type(before)
    ]
    names = tuple(name for name, _ in changed)
    values = [value for _, value in changed]
    spend = record.spend
    if spend is not current.spend and spend != current.spend:
        names = (*names, *SPEND_COLUMNS)
        values.extend(spend_values(spend))
    sql = _UPDATES.get(names)
    if sql is None:
        sets = "".join(f", {name} = ?" for name in names)
        sql = _UPDATES[names] = f"UPDATE runs SET status = ?{sets} WHERE id = ? AND status = ?"
    cur.execute(sql, (record.status.value, *values, current.id, current.status.value))
    check_updated(cur, current, record)


# update_run's statements by the columns they set: a handful (a start, a
# finish, a requeue, a loss), each prepared once by the driver's cache.
_UPDATES: dict[tuple[str, ...], str] = {}


def check_updated(cur: Cursor, current: RunRecord, record: RunRecord, where: str = "") -> None:
    """Raise :class:`StoreConflict` unless the guarded update just made changed the run.

    ``where`` names what else the guard required of it (``" on this supervisor"``).
    """
    if cur.rowcount != 1:
        raise StoreConflict(
            f"run {current.id!r} is no longer {current.status.value}{where}; it cannot become"
            f" {record.status.value} (another writer changed it first)"
        )


# json.dumps with an option builds an encoder per call; runs are inserted
# one by one, so they share this one (json.dumps(value, allow_nan=False)).
_METADATA_JSON = json.JSONEncoder(allow_nan=False)
_STATUSES = {status.value: status for status in RunStatus}
_INSERTED_VALUES = operator.attrgetter(*_INSERTED)
# The columns held as text in the table (JSON, an enum's value), by position.
_METADATA, _STATUS, _NOTES = (_INSERTED.index(n) for n in ("metadata", "status", "notes"))


def _insert_values(record: RunRecord) -> list[Any]:
    values = list(_INSERTED_VALUES(record))
    # ASCII-escaped JSON: any string metadata can hold is storable.
    values[_METADATA] = _METADATA_JSON.encode(record.metadata) if record.metadata else "{}"
    values[_STATUS] = record.status.value
    values[_NOTES] = json.dumps(list(record.notes)) if record.notes else "[]"
    return values


def run_from_row(row: Sequence[Any]) -> RunRecord:
    """The record of a row of :data:`RUN_COLUMNS`."""
    values = list(_IN_FIELD_ORDER(row))
    # Most runs carry no metadata and no notes: no parse for those.
    metadata = values[_FIELD_METADATA]
    values[_FIELD_METADATA] = {} if metadata == "{}" else json.loads(metadata)
    status = values[_FIELD_STATUS]
    values[_FIELD_STATUS] = _STATUSES.get(status) or RunStatus(status)
    notes = values[_FIELD_NOTES]
    values[_FIELD_NOTES] = () if notes == "[]" else tuple(json.loads(notes))
    # Most rows read are queued or running runs: no spend to build.
    values.append(None if row[_MODELS] is None else spend_from_row(row[_SPEND]))
    return RunRecord(*values)


# A row's values in the order of RunRecord's fields, to pass them by position
# (by keyword took half as long again). Every field but the last, spend, has
# its column; spend is read from the row's tail (SPEND_COLUMNS).
_IN_FIELD_ORDER = operator.itemgetter(
    *(RECORD_NAMES.index(name) for name in _FIELDS if name != "spend")
)
_SPEND = slice(len(RECORD_NAMES), len(RECORD_NAMES) + len(SPEND_COLUMNS))
_MODELS = len(RECORD_NAMES) + len(SPEND_COLUMNS) - 1
_FIELD_METADATA, _FIELD_STATUS, _FIELD_NOTES = (
    list(_FIELDS).index(name) for name in ("metadata", "status", "notes")
)


_ATTEMPTS = SCHEMA.table("run_attempts")
#: The run_attempts columns an :class:`Attempt` holds besides its spend, in the table's order.
_ATTEMPT_NAMES: tuple[str, ...] = tuple(
    c.name for c in _ATTEMPTS.columns if c.name not in SPEND_COLUMNS
)
_ATTEMPT_COLUMNS = ", ".join((*_ATTEMPT_NAMES, *SPEND_COLUMNS))
INSERT_ATTEMPT = (
    f"INSERT INTO run_attempts ({_ATTEMPT_COLUMNS})"
    f" VALUES ({', '.join('?' * (len(_ATTEMPT_NAMES) + len(SPEND_COLUMNS)))})"
)
#: A run's attempts, oldest first; parameter: the run's id.
SELECT_ATTEMPTS = f"SELECT {_ATTEMPT_COLUMNS} FROM run_attempts WHERE run_id = ? ORDER BY attempt"
#: Attempts whose run is gone (pruned): deleted with it.
PRUNE_ATTEMPTS = "DELETE FROM run_attempts WHERE run_id NOT IN (SELECT id FROM runs)"


def attempt_values(attempt: Attempt) -> tuple[Any, ...]:
    """``attempt`` as the parameters of :data:`INSERT_ATTEMPT`."""
    return (
        attempt.run_id,
        attempt.attempt,
        attempt.status.value,
        attempt.account,
        attempt.started_at,
        attempt.finished_at,
        attempt.exit_code,
        attempt.reason,
        attempt.failure,
        attempt.retry_at,
        attempt.held_by,
        *spend_values(attempt.spend),
    )


def attempt_from_row(row: Sequence[Any]) -> Attempt:
    """The :class:`Attempt` a row of :data:`SELECT_ATTEMPTS` holds."""
    run_id, attempt, status, account, started, finished, code, reason, failure, retry_at, held = (
        row[: len(_ATTEMPT_NAMES)]
    )
    return Attempt(
        run_id,
        attempt,
        RunStatus(status),
        account,
        started,
        finished,
        code,
        reason,
        failure,
        retry_at,
        spend_from_row(row[len(_ATTEMPT_NAMES) :]),
        held,
    )
