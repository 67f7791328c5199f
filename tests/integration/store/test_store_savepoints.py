"""An operation of a batch shares its savepoint with its first store call, on each real store.

The operation stays all or nothing, and each store call is still undone
alone when it fails: the first call's undo is a rollback to the
operation's savepoint, which nothing of the operation precedes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from herdsman.runtime.store import NewRun, RunEnd, RunStatus, SqliteStore, StoreConflict
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.store.queries import Cursor
from herdsman.runtime.store.sql import SqlStore


class CountingCursor:
    """A real cursor that notes every statement it runs."""

    def __init__(self, cursor: Cursor, statements: list[str]) -> None:
        self._cursor = cursor
        self._statements = statements

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self._statements.append(sql)
        return self._cursor.execute(sql, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class CountingSqlite(SqliteStore):
    statements: ClassVar[list[str]] = []

    def _cursor(self) -> Cursor:
        return cast(Cursor, CountingCursor(super()._cursor(), self.statements))


class CountingPostgres(PostgresStore):
    statements: ClassVar[list[str]] = []

    def _cursor(self) -> Cursor:
        return cast(Cursor, CountingCursor(super()._cursor(), self.statements))


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    made: CountingSqlite | CountingPostgres
    if request.param == "sqlite":
        made = CountingSqlite(tmp_path / "herdsman.db")
    else:
        made = CountingPostgres(request.getfixturevalue("postgres_url"))
    yield made
    made.statements.clear()
    made.close()


def statements(store: SqlStore) -> list[str]:
    return cast(CountingSqlite | CountingPostgres, store).statements


def run(run_id: str) -> NewRun:
    return NewRun(id=run_id, provider="claude", prompt="p")


def savepoints(store: SqlStore) -> int:
    return sum(sql.startswith("SAVEPOINT") for sql in statements(store))


def test_operations_of_one_store_call_take_one_savepoint_each(store: SqlStore) -> None:
    for run_id in ("a", "b", "c"):
        store.submit(run(run_id), 100.0)
    store.mark_running_many([("a", None), ("b", None)], 101.0)
    statements(store).clear()
    results = store.apply(
        [
            lambda s: s.finish("a", RunEnd(RunStatus.SUCCEEDED), 102.0),
            lambda s: s.mark_running_many([("c", None)], 102.0),
            lambda s: s.get("b"),
        ],
        durable=True,
    )
    finished, [started], read = (result.unwrap() for result in results)
    assert (finished.status, started.status, read.status) == (
        RunStatus.SUCCEEDED,
        RunStatus.RUNNING,
        RunStatus.RUNNING,
    )
    assert savepoints(store) == 3  # one per operation, not one more per store call
    statements(store).clear()
    # An operation of several store calls: its own, and one for each call after the first.
    store.apply([lambda s: [s.submit(run(i), 103.0) for i in ("d", "e", "f")]])
    assert savepoints(store) == 3


def test_a_first_call_that_wrote_then_failed_is_undone_alone(store: SqlStore) -> None:
    for run_id in ("a", "b"):
        store.submit(run(run_id), 100.0)

    def operation(s: Any) -> str:
        with contextlib.suppress(StoreConflict):
            # "a" starts, then its second listing is refused: the start must go too.
            s.mark_running_many([("a", None), ("a", None)], 101.0)
        s.mark_running_many([("b", None)], 101.0)
        return "went on"

    [result] = store.apply([operation], durable=True)
    assert result.unwrap() == "went on"
    statuses = [record.status if record else None for record in map(store.get, ("a", "b"))]
    assert statuses == [RunStatus.QUEUED, RunStatus.RUNNING]
    assert not store._in_transaction()


def test_an_operation_that_fails_after_its_first_call_keeps_nothing(store: SqlStore) -> None:
    def operation(s: Any) -> None:
        s.submit(run("mine"), 100.0)
        raise RuntimeError("the operation's own failure")

    mine, other = store.apply(
        [operation, lambda s: s.submit(run("other"), 100.0)],
    )
    with pytest.raises(RuntimeError, match="own failure"):
        mine.unwrap()
    assert other.unwrap()[1] is True
    assert store.get("mine") is None
    assert store.get("other") is not None


def test_an_operation_without_a_store_call_takes_no_savepoint(store: SqlStore) -> None:
    statements(store).clear()
    [result] = store.apply([lambda _: "nothing"])
    assert result.unwrap() == "nothing"
    assert savepoints(store) == 0
    assert not store._in_transaction()
