"""Ledgers made by an earlier herdsman upgrade to the declared schema, on SQLite and PostgreSQL.

The fixtures are version 6 ledgers made by herdsman 8e518e5, whose stores
stated each dialect's DDL by hand: ``ledger-v6.db`` is the SQLite file its
``SqliteStore`` wrote, ``ledger-v6.postgres.sql`` the statements its
``PostgresStore`` ran on an empty schema, then the rows it wrote (read back
from the server). Each test compares the catalog (columns, types, keys,
indexes) of an upgraded ledger with one the current code creates anew:
versions 7 (a run's spend), 8 (run_attempts) and 9 (run_attempts.held_by)
were added since, and a hypothetical version 10 checks that the next one
will upgrade alike. A version 7 ledger, made by this code's own declaration
of version 7 (the schema is declared once, with the version each part came
in), upgrades and keeps the attempts of its runs from then on; a version 8
ledger upgrades and keeps the attempts it held, run by no fleet member.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest

from herdsman.runtime.runner.run_usage import ModelUsage, RunUsage, Tokens
from herdsman.runtime.store import (
    NewRun,
    RunEnd,
    RunStatus,
    Session,
    Spend,
    SqliteStore,
    UsageBy,
)
from herdsman.runtime.store import postgres as postgres_store
from herdsman.runtime.store import sql as sql_module
from herdsman.runtime.store import sqlite as sqlite_store
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.store.queries import attempt_values
from herdsman.runtime.store.records import Attempt
from herdsman.runtime.store.schema import SCHEMA, Column, Dialect, Index, Schema, Type
from postgres_support import fresh_schema

FIXTURES = Path(__file__).parents[2] / "fixtures" / "store"
T0 = 1_700_000_000.0


AHEAD = SCHEMA.version + 1


def one_version_ahead() -> Schema:
    """The schema with a next version that adds a run column and an index on it, written once."""
    runs = SCHEMA.table("runs")
    runs = attrs.evolve(
        runs,
        columns=(
            *runs.columns,
            Column("budget_tokens", Type.BIGINT, since=AHEAD, life=True),
            Column("budget", Type.REAL, not_null=True, default="0", since=AHEAD, life=True),
        ),
        indexes=(*runs.indexes, Index("runs_by_budget", ("budget",), since=AHEAD)),
    )
    tables = tuple(runs if t.name == "runs" else t for t in SCHEMA.tables)
    return Schema(tables=tables, versions=(*SCHEMA.versions, "budgets"))


def at_version(monkeypatch: pytest.MonkeyPatch, module: Any, dialect: Dialect) -> None:
    """Make ``module``'s store write the schema of :func:`one_version_ahead`."""
    ahead = one_version_ahead()
    monkeypatch.setattr(module, "MIGRATIONS", ahead.migrations(dialect))
    monkeypatch.setattr(module, "SCHEMA_VERSION", ahead.version)


# --- SQLite ------------------------------------------------------------------


def sqlite_catalog(path: Path) -> dict[str, Any]:
    """Every table's columns, kind and indexes, as SQLite reports them."""
    conn = sqlite3.connect(path)
    try:
        catalog: dict[str, Any] = {}
        tables = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).fetchall()
        for name, sql in tables:
            indexes = []
            for _, index, unique, origin, partial in conn.execute(f"PRAGMA index_list({name})"):
                # A key's index has no row of its own (nor any SQL).
                found = conn.execute(
                    "SELECT sql FROM sqlite_master WHERE name = ? AND sql IS NOT NULL", (index,)
                ).fetchone()
                shape = conn.execute(f"PRAGMA index_xinfo({index})").fetchall()
                text = None if found is None else " ".join(found[0].split())
                indexes.append((index, unique, origin, partial, shape, text))
            catalog[name] = {
                "columns": conn.execute(f"PRAGMA table_xinfo({name})").fetchall(),
                "kind": conn.execute(
                    "SELECT type, ncol, wr, strict FROM pragma_table_list WHERE name = ?", (name,)
                ).fetchall(),
                "autoincrement": "AUTOINCREMENT" in sql.upper(),
                "indexes": sorted(indexes),
            }
        return catalog
    finally:
        conn.close()


@pytest.fixture
def sqlite_v6(tmp_path: Path) -> Path:
    """A copy of the version 6 SQLite ledger (the fixture itself is never opened)."""
    path = tmp_path / "old" / "herdsman.db"
    path.parent.mkdir()
    shutil.copyfile(FIXTURES / "ledger-v6.db", path)
    return path


def fresh_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "new" / "herdsman.db"
    path.parent.mkdir()
    SqliteStore(path).close()
    return path


def test_a_version_6_sqlite_ledger_has_the_declared_schema(sqlite_v6: Path, tmp_path: Path) -> None:
    store = SqliteStore(sqlite_v6)
    try:
        assert store.schema_version == SCHEMA.version == 9
        assert_fixture_rows(store)
        assert_spend_recorded(store)
    finally:
        store.close()
    upgraded = sqlite_catalog(sqlite_v6)
    assert upgraded == sqlite_catalog(fresh_sqlite(tmp_path))
    assert [c[1:6] for c in upgraded["runs"]["columns"][-9:]] == [
        ("input_tokens", "INTEGER", 0, None, 0),
        ("cache_read_tokens", "INTEGER", 0, None, 0),
        ("cache_write_tokens", "INTEGER", 0, None, 0),
        ("output_tokens", "INTEGER", 0, None, 0),
        ("reasoning_tokens", "INTEGER", 0, None, 0),
        ("cost_usd", "REAL", 0, None, 0),
        ("turns", "INTEGER", 0, None, 0),
        ("api_time", "REAL", 0, None, 0),
        ("models", "TEXT", 0, None, 0),
    ]


def test_a_version_6_sqlite_ledger_upgrades_to_a_declared_new_version(
    sqlite_v6: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_version(monkeypatch, sqlite_store, Dialect.SQLITE)
    store = SqliteStore(sqlite_v6)
    try:
        assert store.schema_version == AHEAD
        assert_fixture_rows(store)
        submitted, _ = store.submit(fixture_run("new"), T0 + 10)
        assert submitted.seq == 5  # the counter the old file kept goes on
    finally:
        store.close()
    upgraded = sqlite_catalog(sqlite_v6)
    assert upgraded == sqlite_catalog(fresh_sqlite(tmp_path))
    assert [c[1:6] for c in upgraded["runs"]["columns"][-2:]] == [
        ("budget_tokens", "INTEGER", 0, None, 0),
        ("budget", "REAL", 1, "0", 0),
    ]
    conn = sqlite3.connect(sqlite_v6)
    try:
        rows = conn.execute("SELECT id, budget_tokens, budget FROM runs ORDER BY seq").fetchall()
    finally:
        conn.close()
    assert rows[:2] == [("done", None, 0), ("waiting", None, 0)]


# --- PostgreSQL --------------------------------------------------------------


def postgres_catalog(url: str) -> dict[str, Any]:
    """Columns, constraints and indexes of the URL's schema, its name left out."""
    with psycopg.connect(url, autocommit=True) as conn:
        (schema,) = conn.execute("SELECT current_schema()").fetchone() or ("",)
        columns = conn.execute(
            "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
            " column_default, collation_name, is_identity, identity_generation"
            " FROM information_schema.columns WHERE table_schema = current_schema()"
            " ORDER BY table_name, ordinal_position"
        ).fetchall()
        constraints = conn.execute(
            "SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)"
            " FROM pg_constraint WHERE connamespace = current_schema()::regnamespace"
            " ORDER BY 1, 2"
        ).fetchall()
        indexes = conn.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = current_schema() ORDER BY 1, 2"
        ).fetchall()
    unqualified = [
        (table, name, re.sub(rf"\b{re.escape(schema)}\.", "", text))
        for table, name, text in indexes
    ]
    return {"columns": columns, "constraints": constraints, "indexes": unqualified}


@pytest.fixture
def postgres_v6(postgres_url: str) -> str:
    """The test's schema, holding the version 6 PostgreSQL ledger."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute((FIXTURES / "ledger-v6.postgres.sql").read_text())
    return postgres_url


@pytest.fixture
def other_schema(postgres_server: str) -> Iterator[str]:
    """A second empty schema beside the test's, for a ledger made anew."""
    with fresh_schema(postgres_server) as url:
        yield url


def test_a_version_6_postgres_ledger_has_the_declared_schema(
    postgres_v6: str, other_schema: str
) -> None:
    store = PostgresStore(postgres_v6)
    try:
        assert store.schema_version == SCHEMA.version == 9
        assert_fixture_rows(store)
        assert_spend_recorded(store)
    finally:
        store.close()
    PostgresStore(other_schema).close()
    upgraded = postgres_catalog(postgres_v6)
    assert upgraded == postgres_catalog(other_schema)
    assert [c[2:6] for c in upgraded["columns"] if c[0] == "runs"][-9:] == [
        ("input_tokens", "bigint", "YES", None),
        ("cache_read_tokens", "bigint", "YES", None),
        ("cache_write_tokens", "bigint", "YES", None),
        ("output_tokens", "bigint", "YES", None),
        ("reasoning_tokens", "bigint", "YES", None),
        ("cost_usd", "double precision", "YES", None),
        ("turns", "integer", "YES", None),
        ("api_time", "double precision", "YES", None),
        ("models", "text", "YES", None),
    ]


def test_a_version_6_postgres_ledger_upgrades_to_a_declared_new_version(
    postgres_v6: str, other_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_version(monkeypatch, postgres_store, Dialect.POSTGRES)
    store = PostgresStore(postgres_v6)
    try:
        assert store.schema_version == AHEAD
        assert_fixture_rows(store)
        assert store.submit(fixture_run("new"), T0 + 10)[0].seq == 5
    finally:
        store.close()
    PostgresStore(other_schema).close()
    upgraded = postgres_catalog(postgres_v6)
    assert upgraded == postgres_catalog(other_schema)
    assert [c[2:6] for c in upgraded["columns"] if c[0] == "runs"][-2:] == [
        ("budget_tokens", "bigint", "YES", None),
        ("budget", "double precision", "NO", "0"),
    ]
    with psycopg.connect(postgres_v6, autocommit=True) as conn:
        rows = conn.execute("SELECT id, budget_tokens, budget FROM runs ORDER BY seq").fetchall()
    assert rows[:2] == [("done", None, 0.0), ("waiting", None, 0.0)]


# --- version 7 to 8: run_attempts ---------------------------------------------


def at_version_7(monkeypatch: pytest.MonkeyPatch, module: Any, dialect: Dialect) -> None:
    """Make ``module``'s store write the schema as it was at version 7."""
    monkeypatch.setattr(module, "MIGRATIONS", SCHEMA.migrations(dialect)[:7])
    monkeypatch.setattr(module, "SCHEMA_VERSION", 7)


def write_v7_rows(store: SqliteStore | PostgresStore) -> None:
    """A usage-limited run, finished with its spend, still to be re-queued."""
    assert store.schema_version == 7
    store.submit(fixture_run("limited"), T0)
    store.mark_running("limited", T0 + 1, "acct")
    store.finish("limited", RunEnd(RunStatus.USAGE_LIMITED, exit_code=1, usage=SEVEN), T0 + 2)


SEVEN = RunUsage(tokens=Tokens(input=7, output=1), turns=1)


def assert_attempts_kept(store: SqliteStore | PostgresStore) -> None:
    """The version 7 run, re-queued after the upgrade, keeps its attempt and its spend."""
    assert store.schema_version == SCHEMA.version
    store.requeue("limited")
    [kept] = store.attempts("limited")
    assert (kept.attempt, kept.status, kept.account, kept.finished_at) == (
        1,
        RunStatus.USAGE_LIMITED,
        "acct",
        T0 + 2,
    )
    assert kept.spend == Spend(SEVEN.tokens, None, (), 1, None)


# --- version 8 to 9: run_attempts.held_by -------------------------------------


def at_version_8(monkeypatch: pytest.MonkeyPatch, module: Any, dialect: Dialect) -> None:
    """Make ``module``'s store write the schema as it was at version 8."""
    monkeypatch.setattr(module, "MIGRATIONS", SCHEMA.migrations(dialect)[:8])
    monkeypatch.setattr(module, "SCHEMA_VERSION", 8)
    # Its attempts had no held_by: written as version 8 wrote them.
    names = [c.name for c in SCHEMA.table("run_attempts").columns if c.name != "held_by"]
    marks = ", ".join("?" * len(names))
    insert = f"INSERT INTO run_attempts ({', '.join(names)}) VALUES ({marks})"
    monkeypatch.setattr(sql_module, "INSERT_ATTEMPT", insert)
    monkeypatch.setattr(sql_module, "attempt_values", _v8_attempt_values)


def _v8_attempt_values(attempt: Attempt) -> tuple[Any, ...]:
    values = attempt_values(attempt)
    held_by = 10  # after retry_at, before the spend
    return values[:held_by] + values[held_by + 1 :]


def write_v8_rows(store: SqliteStore | PostgresStore) -> None:
    """A run retried once: its first attempt kept in run_attempts, as version 8 kept it."""
    assert store.schema_version == 8
    store.submit(fixture_run("retried"), T0)
    store.mark_running("retried", T0 + 1, "acct")
    store.finish("retried", RunEnd(RunStatus.FAILED, exit_code=1, usage=SEVEN), T0 + 2)
    store.requeue("retried", failure="overloaded", retry_at=T0 + 3)


def assert_attempts_unheld(store: SqliteStore | PostgresStore) -> None:
    """The version 8 attempt reads back whole, run by no fleet member (held_by NULL)."""
    assert store.schema_version == SCHEMA.version == 9
    [kept] = store.attempts("retried")
    assert (kept.attempt, kept.account, kept.failure, kept.held_by) == (
        1,
        "acct",
        "overloaded",
        None,
    )
    assert kept.spend == Spend(SEVEN.tokens, None, (), 1, None)


# --- versions 7 and 8, upgraded ------------------------------------------------


#: Each older version's writer, its rows, what the upgrade keeps of them, and
#: a run_attempts column it lacked.
_UPGRADES = {
    7: (at_version_7, write_v7_rows, assert_attempts_kept, "run_id"),
    8: (at_version_8, write_v8_rows, assert_attempts_unheld, "held_by"),
}


@pytest.mark.parametrize("version", sorted(_UPGRADES))
def test_an_older_sqlite_ledger_upgrades_and_keeps_its_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    at, write, check, lacked = _UPGRADES[version]
    path = tmp_path / "old" / "herdsman.db"
    path.parent.mkdir()
    with monkeypatch.context() as patched:
        at(patched, sqlite_store, Dialect.SQLITE)
        old = SqliteStore(path)
        try:
            write(old)
        finally:
            old.close()
    attempts = sqlite_catalog(path).get("run_attempts", {"columns": []})
    assert lacked not in [column[1] for column in attempts["columns"]]
    store = SqliteStore(path)
    try:
        check(store)
    finally:
        store.close()
    assert sqlite_catalog(path) == sqlite_catalog(fresh_sqlite(tmp_path))


@pytest.mark.parametrize("version", sorted(_UPGRADES))
def test_an_older_postgres_ledger_upgrades_and_keeps_its_attempts(
    postgres_url: str, other_schema: str, monkeypatch: pytest.MonkeyPatch, version: int
) -> None:
    at, write, check, lacked = _UPGRADES[version]
    with monkeypatch.context() as patched:
        at(patched, postgres_store, Dialect.POSTGRES)
        old = PostgresStore(postgres_url)
        try:
            write(old)
        finally:
            old.close()
    columns = postgres_catalog(postgres_url)["columns"]
    assert ("run_attempts", lacked) not in [(column[0], column[2]) for column in columns]
    store = PostgresStore(postgres_url)
    try:
        check(store)
    finally:
        store.close()
    PostgresStore(other_schema).close()
    assert postgres_catalog(postgres_url) == postgres_catalog(other_schema)


# --- what both fixtures hold -------------------------------------------------


def fixture_run(run_id: str) -> NewRun:
    return NewRun(id=run_id, provider="claude", prompt="p")


def assert_spend_recorded(store: SqliteStore | PostgresStore) -> None:
    """The earlier runs have no spend; a run finished after the upgrade keeps its own."""
    assert all(record.spend is None for record in store.list_runs())
    assert store.usage(UsageBy.PROVIDER) == []
    usage = RunUsage(
        tokens=Tokens(input=7, output=3),
        cost_usd=0.25,
        models=(ModelUsage("m", Tokens(input=7, output=3), 0.25),),
        turns=2,
        api_time=1.5,
    )
    store.mark_running("waiting", T0 + 20, "acct")
    end = RunEnd(RunStatus.SUCCEEDED, exit_code=0, usage=usage)
    finished = store.finish("waiting", end, T0 + 21)
    assert finished.spend == Spend(usage.tokens, 0.25, usage.models, 2, 1.5)
    assert store.get("waiting") == finished
    assert [(u.group, u.runs, u.tokens, u.cost_usd) for u in store.usage(UsageBy.MODEL)] == [
        ("m", 1, usage.tokens, 0.25)
    ]


def assert_fixture_rows(store: SqliteStore | PostgresStore) -> None:
    """The runs, sessions and limits the earlier herdsman wrote, read by this one."""
    done = store.get("done")
    assert done is not None
    assert (done.seq, done.status, done.metadata, done.cwd) == (
        1,
        RunStatus.SUCCEEDED,
        {"k": [1, "two"]},
        "/w/x",
    )
    assert (done.account, done.exit_code, done.result, done.session_id) == (
        "acct",
        0,
        "ok",
        "sess-1",
    )
    assert (done.excerpt, done.log_path, done.attempts) == ("tail", "/logs/done.log", 1)
    limited = store.get("limited")
    assert limited is not None
    assert (limited.status, limited.attempts, limited.notes, limited.session_id) == (
        RunStatus.QUEUED,
        1,
        ("re-queued once",),
        "sess-3",
    )
    assert [r.id for r in store.queued_in_order()] == ["waiting", "limited"]
    skipped = store.get("skipped")
    assert skipped is not None
    assert (skipped.status, skipped.reason) == (RunStatus.SKIPPED, "busy")
    assert store.sessions() == [
        Session("claude", "default", "c0", "sess-0", None),
        Session("claude", "default", "c1", "sess-1", "acct"),
    ]
    assert [(x.account, x.until) for x in store.account_limits(T0)] == [
        (None, T0 + 60),
        ("acct", T0 + 3600),
    ]
