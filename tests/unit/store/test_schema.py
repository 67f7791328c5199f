"""The schema declaration: what each dialect's DDL says, and declarations no migration could run."""

from __future__ import annotations

import re

import attrs
import pytest

from herdsman.runtime.store.schema import SCHEMA, Column, Dialect, Index, Schema, Table, Type


def notes_schema(*extra: Column, index: Index | None = None, versions: int = 2) -> Schema:
    columns = (Column("seq", Type.SERIAL), Column("body", Type.TEXT, not_null=True), *extra)
    indexes = () if index is None else (index,)
    table = Table("notes", columns, indexes=indexes)
    return Schema(tables=(table,), versions=tuple(f"v{n}" for n in range(1, versions + 1)))


def test_each_version_adds_what_was_declared_with_it_in_each_dialect() -> None:
    schema = notes_schema(
        Column("tag", Type.TEXT, since=2),
        index=Index("notes_by_tag", ("tag",), where="tag IS NOT NULL", since=2),
    )
    assert schema.migrations(Dialect.SQLITE) == (
        (
            "CREATE TABLE notes (\n    seq INTEGER PRIMARY KEY AUTOINCREMENT,\n"
            "    body TEXT NOT NULL\n)",
        ),
        (
            "ALTER TABLE notes ADD COLUMN tag TEXT",
            "CREATE INDEX notes_by_tag ON notes (tag) WHERE tag IS NOT NULL",
        ),
    )
    assert schema.migrations(Dialect.POSTGRES)[1][0] == (
        'ALTER TABLE notes ADD COLUMN tag TEXT COLLATE "C"'
    )


def test_a_keyed_table_is_without_rowid_on_sqlite_only() -> None:
    table = Table("limits", (Column("name", Type.TEXT, not_null=True),), key=("name",))
    schema = Schema(tables=(table,), versions=("v1",))
    assert schema.migrations(Dialect.SQLITE)[0][0].endswith(") WITHOUT ROWID")
    assert schema.migrations(Dialect.POSTGRES)[0][0].endswith("PRIMARY KEY (name)\n)")


def test_an_index_of_one_dialect_is_left_out_of_the_other() -> None:
    only = Index("notes_by_body", ("body",), dialects=frozenset({Dialect.POSTGRES}))
    schema = notes_schema(index=only, versions=1)
    assert len(schema.migrations(Dialect.SQLITE)[0]) == 1
    assert schema.migrations(Dialect.POSTGRES)[0][1] == "CREATE INDEX notes_by_body ON notes (body)"


@pytest.mark.parametrize(
    ("column", "index", "message"),
    [
        (Column("tag", Type.TEXT, since=3), None, "notes.tag is said to be added in version 3"),
        (
            Column("tag", Type.TEXT, not_null=True, since=2),
            None,
            "notes.tag is NOT NULL and added to an existing table: give it a default",
        ),
        (
            Column("tag", Type.TEXT, unique=True, since=2),
            None,
            "cannot take a UNIQUE or key column",
        ),
        (
            Column("tag", Type.TEXT, since=2),
            Index("notes_by_tag", ("tag",), since=1),
            "index notes_by_tag (version 1) names column tag, added later (version 2)",
        ),
    ],
)
def test_a_declaration_no_migration_could_run_is_refused(
    column: Column, index: Index | None, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        notes_schema(column, index=index)


def test_the_runs_columns_a_life_rewrites_are_the_attempts_outcome() -> None:
    life = [c.name for c in SCHEMA.table("runs").columns if c.life]
    assert life == [
        "started_at",
        "finished_at",
        "account",
        "exit_code",
        "reason",
        "result",
        "session_id",
        "excerpt",
        "log_path",
        "attempts",
    ]


def test_every_field_of_a_run_record_is_a_column_of_runs() -> None:
    """The shared queries read a record from its columns, by name: none may be missing."""
    from herdsman.runtime.store.queries import RECORD_NAMES, SPEND_COLUMNS
    from herdsman.runtime.store.records import RunRecord

    # spend is read from its own columns, SPEND_COLUMNS.
    assert sorted(RECORD_NAMES) == sorted(set(attrs.fields_dict(RunRecord)) - {"spend"})
    others = [c.name for c in SCHEMA.table("runs").columns if c.name not in RECORD_NAMES]
    assert others == ["held_by", "cancel_request", "requeue_mark", *SPEND_COLUMNS]
