"""PostgresStore on a real server: schema versions, transactions, durability, failures.

What every store does is in the contract suite; this file holds what only
the PostgreSQL store has to prove (the counterpart of test_sqlite_store.py).
Each test gets a schema of its own on the test server (``postgres_url``).
"""

from __future__ import annotations

import socket
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from herdsman.runtime.store import (
    NewRun,
    RunEnd,
    RunStatus,
    SqliteStore,
    StoreConflict,
    StoreError,
)
from herdsman.runtime.store import sqlite as sqlite_store
from herdsman.runtime.store.errors import ConnectionLost, LedgerNotCurrent
from herdsman.runtime.store.postgres import MIGRATIONS, SCHEMA_VERSION, PostgresStore
from postgres_support import fresh_schema, split_password, with_search_path

T0 = 1_700_000_000.0


def new(run_id: str) -> NewRun:
    return NewRun(id=run_id, provider="claude", prompt="p", conversation="c")


def raw(url: str) -> psycopg.Connection[tuple[object, ...]]:
    """A connection of our own, beside the store's, on the same schema."""
    return psycopg.connect(url, autocommit=True)


def test_data_survives_reopening_and_seq_is_never_reused(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    store.submit(NewRun(id="a", provider="claude", prompt="p", metadata={"k": [1]}), T0)
    store.mark_running("a", T0 + 1, "acct")
    store.finish("a", RunEnd(RunStatus.SUCCEEDED, exit_code=0, result="done"), T0 + 2)
    store.skip(new("b"), T0, "no")
    store.set_conversation_session("claude", "default", "c", "sess", "acct")
    before = store.list_runs()
    assert store.prune(T0 + 5) == 2  # the newest run goes too
    store.close()
    reopened = PostgresStore(postgres_url)
    try:
        assert reopened.list_runs() == []
        assert [r.seq for r in before] == [2, 1]
        assert reopened.submit(new("c"), T0)[0].seq == 3
        assert reopened.conversation_session("claude", "default", "c") is not None
    finally:
        reopened.close()


def columns_in_sqlite(tmp_path: Path) -> dict[str, list[str]]:
    SqliteStore(tmp_path / "herdsman.db").close()
    conn = sqlite3.connect(tmp_path / "herdsman.db")
    try:
        return {
            table: [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            for table in ("runs", "conversation_sessions", "account_limits", "supervisors")
        }
    finally:
        conn.close()


def test_a_new_database_gets_the_same_tables_and_version_as_sqlite(
    postgres_url: str, tmp_path: Path
) -> None:
    store = PostgresStore(postgres_url)
    try:
        assert store.schema_version == SCHEMA_VERSION == sqlite_store.SCHEMA_VERSION
    finally:
        store.close()
    with raw(postgres_url) as conn:
        found = {
            table: [
                name
                for (name,) in conn.execute(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_schema = current_schema() AND table_name = %s"
                    " ORDER BY ordinal_position",
                    (table,),
                )
            ]
            for table in ("runs", "conversation_sessions", "account_limits", "supervisors")
        }
        assert conn.execute("SELECT version FROM herdsman_schema").fetchall() == [(SCHEMA_VERSION,)]
    assert found == columns_in_sqlite(tmp_path)


def test_a_schema_newer_than_the_code_is_refused_and_left_alone(postgres_url: str) -> None:
    PostgresStore(postgres_url).close()
    with raw(postgres_url) as conn:
        conn.execute("UPDATE herdsman_schema SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError) as caught:
        PostgresStore(postgres_url)
    message = str(caught.value)
    assert "the run ledger on PostgreSQL server" in message
    assert f"schema version {SCHEMA_VERSION + 1}, newer than" in message
    assert f"understands ({SCHEMA_VERSION})" in message
    assert "upgrade herdsman" in message
    with raw(postgres_url) as conn:
        assert conn.execute("SELECT version FROM herdsman_schema").fetchall() == [
            (SCHEMA_VERSION + 1,)
        ]


def test_a_version_1_schema_is_migrated_and_keeps_its_runs(postgres_url: str) -> None:
    with raw(postgres_url) as conn:
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("CREATE TABLE herdsman_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO herdsman_schema VALUES (1)")
        conn.execute(
            "INSERT INTO runs (id, provider, prompt, workspace, metadata, status, submitted_at,"
            " attempts) VALUES ('r1', 'p', 'x', 'default', '{}', 'queued', 1.0, 0)"
        )
    store = PostgresStore(postgres_url)
    try:
        assert store.schema_version == SCHEMA_VERSION
        record = store.get("r1")
        assert record is not None
        assert (record.status, record.notes, record.cwd) == (RunStatus.QUEUED, (), None)
        store.add_note("r1", "kept")
        store.set_account_limit("p", None, 5.0, "limit")
        assert store.submit(new("r2"), 2.0)[0].seq == 2
    finally:
        store.close()


def test_a_reader_that_may_not_upgrade_leaves_every_schema_as_it_is(postgres_url: str) -> None:
    with pytest.raises(LedgerNotCurrent) as caught:
        PostgresStore(postgres_url, upgrade=False)
    assert caught.value.version == 0
    assert "holds no runs yet" in str(caught.value)
    with raw(postgres_url) as conn:
        assert conn.execute("SELECT to_regclass('runs')").fetchone() == (None,)
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("CREATE TABLE herdsman_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO herdsman_schema VALUES (1)")
    with pytest.raises(LedgerNotCurrent, match="schema version 1, older than this herdsman"):
        PostgresStore(postgres_url, upgrade=False)
    with raw(postgres_url) as conn:
        assert conn.execute("SELECT version FROM herdsman_schema").fetchall() == [(1,)]
    PostgresStore(postgres_url).close()  # upgraded by a supervisor: now it reads
    PostgresStore(postgres_url, upgrade=False).close()


def test_supervisors_starting_together_create_the_schema_once(postgres_url: str) -> None:
    barrier = threading.Barrier(4)
    opened: list[PostgresStore] = []
    failures: list[BaseException] = []

    def open_store() -> None:
        barrier.wait()
        try:
            opened.append(PostgresStore(postgres_url))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for store in opened:
        store.close()
    assert failures == []
    assert len(opened) == 4
    with raw(postgres_url) as conn:
        assert conn.execute("SELECT version FROM herdsman_schema").fetchall() == [(SCHEMA_VERSION,)]


def test_an_apply_batch_is_invisible_to_others_until_it_commits(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    seen_inside: list[int] = []
    try:
        with raw(postgres_url) as other:

            def look(_: object) -> None:
                row = other.execute("SELECT count(*) FROM runs").fetchone()
                assert row is not None
                (count,) = row
                assert isinstance(count, int)
                seen_inside.append(count)

            store.apply([lambda s: s.submit(new("a"), T0), look, lambda s: s.submit(new("b"), T0)])
            row = other.execute("SELECT count(*) FROM runs").fetchone()
    finally:
        store.close()
    assert seen_inside == [0]
    assert row == (2,)


def test_commits_are_synchronous_whatever_the_server_or_url_says(postgres_url: str) -> None:
    # A URL (or a server default) that turns synchronous commits off would let
    # a start vanish in a server crash, and the run start twice. The fixture's
    # URL ends in options=-csearch_path...; this adds a second option to it.
    asking_off = f"{postgres_url}%20-csynchronous_commit%3Doff"
    store = PostgresStore(asking_off)
    try:
        with raw(asking_off) as other:
            assert other.execute("SHOW synchronous_commit").fetchone() == ("off",)
        assert store._conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    finally:
        store.close()


SECRET = "s3cret-pw"


@contextmanager
def socket_nobody_listens_on() -> Iterator[int]:
    """A local port that is bound (so nothing else takes it) but refuses connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_an_unreachable_server_is_named_and_the_password_is_not(postgres_server: str) -> None:
    with socket_nobody_listens_on() as port:
        url = f"postgresql://herdsman:{SECRET}@127.0.0.1:{port}/herdsman_test"
        with pytest.raises(StoreError) as caught:
            PostgresStore(url, connect_timeout=5)
    message = str(caught.value)
    assert message.startswith(
        f"cannot connect to the run ledger on PostgreSQL server 127.0.0.1 port {port},"
        " database 'herdsman_test': "
    )
    assert "Connection refused" in message
    assert "\n" not in message
    assert SECRET not in message


def test_a_wrong_password_is_named_without_showing_it(postgres_server: str) -> None:
    base, password = split_password(postgres_server)
    if password is None:
        pytest.skip("the test server's role has no password to get wrong")
    scheme, _, rest = base.partition("://")
    user, _, server = rest.partition("@")
    wrong = f"{scheme}://{user}:{SECRET}@{server}"
    with pytest.raises(StoreError, match="password authentication failed") as caught:
        PostgresStore(wrong)
    assert SECRET not in str(caught.value)
    assert "PostgreSQL server" in str(caught.value)


def cut(url: str, store: PostgresStore) -> None:
    """End the store's session on the server, as a server restart or a network cut does."""
    with raw(url) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (store._conn.info.backend_pid,))


def test_a_lost_connection_is_made_again_at_the_next_call(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    try:
        store.submit(new("a"), T0)
        cut(postgres_url, store)
        # The call that meets the dead connection fails (nothing was recorded) ...
        with pytest.raises(ConnectionLost, match=r"^run ledger on PostgreSQL server .+ database"):
            store.submit(new("b"), T0)
        # ... and the next one connects again, set up as at start.
        created = store.submit(new("b"), T0)
        assert (created[0].seq, created[1]) == (2, True)
        assert [r.id for r in store.list_runs()] == ["b", "a"]
    finally:
        store.close()
    store.close()  # still idempotent


def test_a_batch_the_connection_broke_under_is_applied_once_on_a_new_connection(
    postgres_url: str,
) -> None:
    store = PostgresStore(postgres_url)
    try:
        store.submit(new("a"), T0)
        cut(postgres_url, store)
        noted, submitted = store.apply(
            [lambda s: s.add_note("a", "once"), lambda s: s.submit(new("b"), T0)]
        )
        assert noted.unwrap().notes == ("once",)
        assert submitted.unwrap()[1] is True
        with raw(postgres_url) as other:
            rows = other.execute("SELECT id, notes FROM runs ORDER BY seq").fetchall()
        assert rows == [("a", '["once"]'), ("b", "[]")]
    finally:
        store.close()


def test_reconnecting_pauses_after_a_failure_and_keeps_the_sole_supervisor_lock(
    postgres_server: str,
) -> None:
    with fresh_schema(postgres_server) as url:
        store = PostgresStore(url, sole=True)
        clock = [100.0]
        store._monotonic = lambda: clock[0]
        try:
            store.submit(new("a"), T0)
            cut(url, store)
            # Another supervisor took the ledger while the connection was down.
            other = PostgresStore(url, sole=True)
            refused = "another herdsman supervisor is using the run ledger on PostgreSQL server"
            with pytest.raises(StoreError) as meets_the_cut:
                store.get("a")
            assert type(meets_the_cut.value) is ConnectionLost
            with pytest.raises(StoreError, match=f"^{refused}"):
                store.get("a")
            # No attempt before the pause is over: the refusal is remembered.
            with pytest.raises(ConnectionLost) as paused:
                store.get("a")
            assert "the next attempt is made in 0.5 s" in str(paused.value)
            assert refused in str(paused.value)
            clock[0] += 0.5
            with pytest.raises(StoreError, match=f"^{refused}"):
                store.get("a")
            other.close()
            clock[0] += 0.9  # the pause doubled: not over yet
            with pytest.raises(ConnectionLost, match=r"the next attempt is made in 0\.1 s"):
                store.get("a")
            clock[0] += 0.1
            record = store.get("a")
            assert record is not None
            assert record.id == "a"
            # The lock is held again: no second supervisor gets in.
            with pytest.raises(StoreError, match=f"^{refused}"):
                PostgresStore(url, sole=True)
        finally:
            store.close()


def test_a_url_that_is_not_postgresql_is_refused_before_connecting() -> None:
    with pytest.raises(StoreError, match=r"^the PostgreSQL store URL must be a PostgreSQL URL"):
        PostgresStore("mysql://herdsman:pw@db/herdsman")


# --- concurrency -------------------------------------------------------------


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    racers=st.integers(2, 4),
    orders=st.lists(st.permutations(range(6)), min_size=4, max_size=4),
)
def test_stores_racing_to_start_runs_never_both_win(
    postgres_server: str, racers: int, orders: list[list[int]]
) -> None:
    """Several connections (as several supervisors would) start the same runs
    in their own orders: every run is started exactly once, by one of them,
    and every other attempt is a StoreConflict that changed nothing."""
    with fresh_schema(postgres_server) as url:
        stores = [PostgresStore(url) for _ in range(racers)]
        try:
            run_ids = [f"r{i}" for i in range(6)]
            for run_id in run_ids:
                stores[0].submit(new(run_id), T0)
            wins: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
            conflicts: list[str] = []
            lock = threading.Lock()
            barrier = threading.Barrier(racers)

            def race(number: int) -> None:
                barrier.wait()
                for index in orders[number]:
                    run_id = run_ids[index]
                    try:
                        stores[number].mark_running(run_id, T0 + 1, f"s{number}")
                    except StoreConflict:
                        with lock:
                            conflicts.append(run_id)
                    else:
                        with lock:
                            wins[run_id].append(f"s{number}")

            threads = [threading.Thread(target=race, args=(n,)) for n in range(racers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert all(len(winners) == 1 for winners in wins.values()), wins
            assert sorted(conflicts) == sorted(run_ids * (racers - 1))
            for run_id, winners in wins.items():
                record = stores[0].get(run_id)
                assert record is not None
                assert (record.status, record.account, record.attempts) == (
                    RunStatus.RUNNING,
                    winners[0],
                    1,
                )
        finally:
            for store in stores:
                store.close()


def test_a_schema_of_its_own_per_url(postgres_server: str) -> None:
    """What lets every test (and every herdsman deployment) share one database."""
    with fresh_schema(postgres_server) as one, fresh_schema(postgres_server) as two:
        first, second = PostgresStore(one), PostgresStore(two)
        try:
            first.submit(new("a"), T0)
            assert second.get("a") is None
            assert second.submit(new("b"), T0)[0].seq == 1
        finally:
            first.close()
            second.close()
    assert with_search_path("postgresql://h/d", "s") == "postgresql://h/d?options=-csearch_path%3Ds"


def test_one_ledger_serves_one_supervisor_at_a_time(postgres_server: str) -> None:
    with fresh_schema(postgres_server) as url, fresh_schema(postgres_server) as elsewhere:
        first = PostgresStore(url, sole=True)
        try:
            with pytest.raises(StoreError) as caught:
                PostgresStore(url, sole=True)
            assert str(caught.value).startswith(
                "another herdsman supervisor is using the run ledger on PostgreSQL server"
            )
            assert "fleet coordination" in str(caught.value)
            # Another schema is another ledger; plain (not sole) opens are tools and tests.
            PostgresStore(elsewhere, sole=True).close()
            PostgresStore(url).close()
        finally:
            first.close()
        # Closing (or losing) the connection lets the next supervisor in.
        PostgresStore(url, sole=True).close()


def test_a_read_failing_inside_a_batch_does_not_abort_the_writes_beside_it(
    postgres_url: str,
) -> None:
    # A failed statement aborts a PostgreSQL transaction, and COMMIT then
    # rolls back without a word: the start below would be reported as
    # recorded, spawned, and run again after a restart.
    store = PostgresStore(postgres_url + "%20-clock_timeout%3D200")
    try:
        store.submit(new("r"), T0)
        with raw(postgres_url) as admin, admin.transaction():
            admin.execute("LOCK TABLE conversation_sessions IN ACCESS EXCLUSIVE MODE")
            started, lookup = store.apply(
                [
                    lambda s: s.mark_running_many([("r", "acct")], T0 + 1),
                    lambda s: s.conversation_session("claude", "default", "c"),
                ],
                durable=True,
            )
        # The read failed alone, as a StoreError; the start was kept.
        with pytest.raises(StoreError, match="lock timeout"):
            lookup.unwrap()
        assert started.unwrap()[0].status is RunStatus.RUNNING
        record = store.get("r")
        assert record is not None
        assert record.status is RunStatus.RUNNING
    finally:
        store.close()


def test_a_refused_second_supervisor_leaves_the_schema_alone(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from herdsman.runtime.store import postgres

    running = PostgresStore(postgres_url, sole=True)
    try:
        # A newer herdsman, one migration ahead, started by mistake on the same ledger.
        newer = (*MIGRATIONS, ("ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL",))
        monkeypatch.setattr(postgres, "MIGRATIONS", newer)
        monkeypatch.setattr(postgres, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
        with pytest.raises(StoreError, match="another herdsman supervisor"):
            PostgresStore(postgres_url, sole=True)
        monkeypatch.undo()
        assert running.schema_version == SCHEMA_VERSION
        assert running.submit(new("a"), T0)[1]
    finally:
        running.close()


def test_times_keep_every_digit_whatever_the_server_prints(postgres_url: str) -> None:
    store = PostgresStore(postgres_url + "%20-cextra_float_digits%3D0")
    try:
        now = 1_764_400_000.123456
        store.submit(new("a"), now)
        record = store.get("a")
        assert record is not None
        assert record.submitted_at == now
    finally:
        store.close()


def test_the_lock_and_the_tables_are_in_one_schema(postgres_server: str) -> None:
    with fresh_schema(postgres_server) as url_b, fresh_schema(postgres_server) as url_a:
        b, a = url_b.rsplit("%3D", 1)[1], url_a.rsplit("%3D", 1)[1]
        first = PostgresStore(url_b, sole=True)
        # A search_path of two schemas, the first empty (a `CREATE SCHEMA`
        # after the tables were made in the second, say): the ledger is the
        # first's, not a share of the other supervisor's.
        second = PostgresStore(f"{postgres_server}?options=-csearch_path%3D{a},{b}", sole=True)
        try:
            second.submit(new("x"), T0)
            assert first.get("x") is None
        finally:
            first.close()
            second.close()
