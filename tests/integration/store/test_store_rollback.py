"""A rollback that fails after an error never hides that error, on each real store.

The connection is real; only the statements named are made to fail, as a
connection that drops between the COMMIT and the ROLLBACK would.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

import psycopg
import pytest

from herdsman.runtime.store import NewRun, RunStatus, SqliteStore, StoreConflict, StoreError
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.store.sql import Cursor, SqlStore


class FailingCursor:
    """A real cursor, but the statements in ``failing`` raise instead of running."""

    def __init__(self, cursor: Cursor, failing: dict[str, Exception]) -> None:
        self._cursor = cursor
        self._failing = failing

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        if sql in self._failing:
            raise self._failing[sql]
        return self._cursor.execute(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class FailingSqlite(SqliteStore):
    failing: ClassVar[dict[str, Exception]] = {}

    def _cursor(self) -> Cursor:
        return cast(Cursor, FailingCursor(super()._cursor(), self.failing))


class FailingPostgres(PostgresStore):
    failing: ClassVar[dict[str, Exception]] = {}

    def _cursor(self) -> Cursor:
        return cast(Cursor, FailingCursor(super()._cursor(), self.failing))


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    made: FailingSqlite | FailingPostgres
    if request.param == "sqlite":
        made = FailingSqlite(tmp_path / "herdsman.db")
    else:
        made = FailingPostgres(request.getfixturevalue("postgres_url"))
    yield made
    made.failing.clear()
    made.close()


def driver_error(store: SqlStore, message: str) -> Exception:
    return (
        sqlite3.OperationalError(message)
        if isinstance(store, SqliteStore)
        else psycopg.OperationalError(message)
    )


def failing(store: SqlStore) -> dict[str, Exception]:
    return cast(FailingSqlite | FailingPostgres, store).failing


def test_a_failed_commit_whose_rollback_fails_is_a_store_error_naming_both(
    store: SqlStore,
) -> None:
    commit, rollback = driver_error(store, "disk I/O error"), driver_error(store, "gone")
    failing(store).update({"COMMIT": commit, "ROLLBACK": rollback})
    with pytest.raises(StoreError) as caught:
        store.submit(NewRun(id="r", provider="claude", prompt="p"), 100.0)
    assert str(caught.value).endswith(": disk I/O error (and the rollback failed: gone)")
    assert caught.value.__cause__ is rollback
    assert rollback.__context__ is commit


def test_a_refused_change_whose_rollback_fails_is_still_the_refusal(store: SqlStore) -> None:
    store.submit(NewRun(id="r", provider="claude", prompt="p"), 100.0)
    failing(store)["ROLLBACK"] = driver_error(store, "gone")
    with pytest.raises(StoreConflict) as caught:
        store.finish("r", RunStatus.SUCCEEDED, 101.0)  # queued, never started
    assert caught.value.__notes__[-1].endswith(": the rollback failed too: gone")
