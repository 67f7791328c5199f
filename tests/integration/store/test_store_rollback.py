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

from herdsman.runtime.store import NewRun, RunEnd, RunStatus, SqliteStore, StoreConflict, StoreError
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.store.queries import Cursor
from herdsman.runtime.store.sql import SqlStore


class TransactionLost(Exception):
    """A failure that rolls back the whole transaction before it raises ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class FailingCursor:
    """A real cursor, but the statements in ``failing`` raise instead of running."""

    def __init__(self, cursor: Cursor, failing: dict[str, Exception]) -> None:
        self._cursor = cursor
        self._failing = failing

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        if sql in self._failing:
            failure = self._failing[sql]
            if isinstance(failure, TransactionLost):
                self._cursor.execute("ROLLBACK")
                raise failure.error
            raise failure
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
        store.finish("r", RunEnd(RunStatus.SUCCEEDED), 101.0)  # queued, never started
    assert caught.value.__notes__[-1].endswith(": the rollback failed too: gone")


# --- inside a batch: an operation's savepoint ------------------------------

ROLLBACK_TO = "ROLLBACK TO SAVEPOINT operation"
RELEASE = "RELEASE SAVEPOINT operation"


def in_transaction(store: SqlStore) -> bool:
    return store._in_transaction()


def test_a_refusal_in_a_batch_whose_undo_fails_fails_the_batch_naming_the_refusal(
    store: SqlStore,
) -> None:
    store.submit(NewRun(id="r", provider="claude", prompt="p"), 100.0)
    gone = driver_error(store, "gone")
    failing(store)[ROLLBACK_TO] = gone
    with pytest.raises(StoreError) as caught:
        store.apply(
            [
                lambda s: s.submit(NewRun(id="before", provider="claude", prompt="p"), 101.0),
                lambda s: s.finish("r", RunEnd(RunStatus.SUCCEEDED), 101.0),  # queued: refused
                lambda s: s.submit(NewRun(id="after", provider="claude", prompt="p"), 101.0),
            ]
        )
    failing(store).clear()
    refusal = caught.value.__cause__
    # The refusal is what the batch reports; the undo's failure rides along.
    assert isinstance(refusal, StoreConflict)
    assert str(refusal).startswith("run 'r' is queued; it cannot become succeeded")
    assert refusal.__notes__[-1].endswith(": the rollback failed too: gone")
    assert str(caught.value).endswith(
        f"the batch was rolled back: an operation failed and could not be undone: {refusal}"
    )
    # What the failed operation may have left is not committed, nor anything
    # else of the batch, and the connection is in no transaction or savepoint.
    assert not in_transaction(store)
    assert [store.get(i) for i in ("before", "after")] == [None, None]
    store.submit(NewRun(id="next", provider="claude", prompt="p"), 102.0)
    assert [r.id for r in store.queued_in_order()] == ["r", "next"]


def test_a_driver_error_in_a_batch_whose_undo_fails_is_a_store_error_naming_both(
    store: SqlStore,
) -> None:
    broken, gone = driver_error(store, "disk I/O error"), driver_error(store, "gone")
    failing(store).update({"SELECT status, COUNT(*) FROM runs GROUP BY status": broken})
    failing(store)[ROLLBACK_TO] = gone
    with pytest.raises(StoreError) as caught:
        store.apply(
            [
                lambda s: s.submit(NewRun(id="a", provider="claude", prompt="p"), 100.0),
                lambda s: s.counts(),
            ]
        )
    failing(store).clear()
    first = caught.value.__cause__
    assert isinstance(first, StoreError)
    assert str(first).endswith(": disk I/O error (and the rollback failed: gone)")
    assert first.__cause__ is gone
    assert gone.__context__ is broken
    assert not in_transaction(store)
    assert store.get("a") is None


def test_a_batch_whose_release_fails_keeps_nothing(store: SqlStore) -> None:
    failing(store)[RELEASE] = driver_error(store, "gone")
    with pytest.raises(StoreError, match="the batch was rolled back") as caught:
        store.apply([lambda s: s.submit(NewRun(id="a", provider="claude", prompt="p"), 100.0)])
    failing(store).clear()
    assert str(caught.value.__cause__).endswith(": gone (and the rollback failed: gone)")
    # The submit succeeded but its savepoint could not be closed: it is
    # undone with the batch, never committed behind a reported failure.
    assert not in_transaction(store)
    assert store.get("a") is None


def test_operations_after_an_undo_that_failed_run_in_no_transaction_of_their_own(
    store: SqlStore,
) -> None:
    # As SQLite does on some errors (a full disk): the failed statement took
    # the whole transaction with it, so the savepoint is gone too. A later
    # operation must not open a transaction of its own and commit it alone.
    store.submit(NewRun(id="r", provider="claude", prompt="p"), 100.0)
    gone = driver_error(store, "no such savepoint: operation")
    failing(store)[ROLLBACK_TO] = TransactionLost(gone)
    with pytest.raises(StoreError, match="could not be undone") as caught:
        store.apply(
            [
                lambda s: s.finish("r", RunEnd(RunStatus.SUCCEEDED), 101.0),  # refused
                lambda s: s.submit(NewRun(id="after", provider="claude", prompt="p"), 101.0),
            ]
        )
    failing(store).clear()
    assert isinstance(caught.value.__cause__, StoreConflict)
    assert not in_transaction(store)
    assert store.get("after") is None


def test_a_postgres_undo_that_fails_reports_both_errors_cleaned_as_any_driver_error(
    postgres_url: str,
) -> None:
    # libpq's messages span lines and may quote the password: a failed undo
    # must clean both the operation's error and its own, as _failure does.
    store = FailingPostgres(postgres_url)
    secret = store._password or ""
    shown = "***" if secret else ""
    failing(store).update(
        {
            "SELECT status, COUNT(*) FROM runs GROUP BY status": psycopg.OperationalError(
                "disk I/O error\nDETAIL:  the disk is full"
            ),
            ROLLBACK_TO: psycopg.OperationalError(
                f"server closed the connection unexpectedly\n\tpassword {secret} was refused"
            ),
        }
    )
    try:
        with pytest.raises(StoreError) as caught:
            store.apply([lambda s: s.counts()])
    finally:
        failing(store).clear()
        store.close()
    message = str(caught.value)
    assert message.endswith(
        ": disk I/O error; DETAIL:  the disk is full (and the rollback failed:"
        f" server closed the connection unexpectedly; password {shown} was refused)"
    )
    assert len(message.splitlines()) == 1
