"""What only the SQLite store promises: durability, crash recovery, schema versions."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import trio

from herdsman.runtime.store import (
    LOST_ON_RESTART,
    SCHEMA_VERSION,
    AccountLimit,
    AccountUse,
    NewRun,
    RunEnd,
    RunStatus,
    Session,
    SqliteStore,
    StoreConflict,
    StoreError,
)

T0 = 1_700_000_000.0


def new(run_id: str) -> NewRun:
    return NewRun(id=run_id, provider="claude", prompt="p", conversation="c")


def test_data_survives_closing_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "herdsman.db"
    store = SqliteStore(path)
    store.submit(NewRun(id="a", provider="claude", prompt="p", metadata={"k": [1]}), T0)
    store.submit(new("b"), T0 + 1)
    store.mark_running("a", T0 + 2, "acct")
    store.finish("a", RunEnd(RunStatus.SUCCEEDED, exit_code=0, result="done"), T0 + 3)
    store.set_conversation_session("claude", "default", "c", "sess")
    store.set_conversation_session("claude", "default", "d", "sess-d", "acct")
    store.set_account_limit("claude", "acct", T0 + 60, "limit reached")
    store.set_account_limit("claude", None, T0 + 60, "ambient limit")
    before = store.list_runs()
    store.close()

    reopened = SqliteStore(path)
    try:
        assert reopened.list_runs() == before
        assert reopened.sessions() == [
            Session("claude", "default", "c", "sess", None),
            Session("claude", "default", "d", "sess-d", "acct"),
        ]
        assert reopened.account_limits(T0) == [
            AccountLimit("claude", None, T0 + 60, "ambient limit"),
            AccountLimit("claude", "acct", T0 + 60, "limit reached"),
        ]
        assert reopened.account_usage(T0) == [AccountUse("claude", "acct", T0 + 2, T0 + 3)]
        assert reopened.counts()[RunStatus.SUCCEEDED] == 1
        assert reopened.submit(new("c"), T0)[0].seq == 3
    finally:
        reopened.close()


def test_seq_is_not_reused_after_pruning_the_newest_run_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "herdsman.db"
    store = SqliteStore(path)
    store.skip(new("a"), T0, "no")
    store.skip(new("b"), T0, "no")
    assert store.prune(T0 + 1) == 2
    store.close()
    reopened = SqliteStore(path)
    try:
        assert reopened.submit(new("c"), T0)[0].seq == 3
    finally:
        reopened.close()


CRASHING_SUPERVISOR = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from herdsman.runtime.store import NewRun, SqliteStore

    store = SqliteStore(Path(sys.argv[1]))
    store.submit(NewRun(id="started", provider="claude", prompt="p"), 100.0)
    store.submit(NewRun(id="waiting", provider="claude", prompt="p"), 101.0)
    store.mark_running("started", 102.0, "acct")
    print("ready", flush=True)
    time.sleep(60)
    """
)


def test_a_run_started_by_a_killed_process_is_recovered_as_lost_exactly_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "herdsman.db"
    with subprocess.Popen(
        [sys.executable, "-c", CRASHING_SUPERVISOR, str(path)],
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "ready\n"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    store = SqliteStore(path)
    try:
        running = store.get("started")
        assert running is not None
        assert (running.status, running.account, running.attempts) == (RunStatus.RUNNING, "acct", 1)
        lost = store.recover(200.0)
        assert [r.id for r in lost] == ["started"]
        assert lost[0].status is RunStatus.LOST
        assert lost[0].reason == LOST_ON_RESTART
        assert lost[0].finished_at == 200.0
        # Never re-queued: the only queued run is the one that never started.
        assert [r.id for r in store.queued_in_order()] == ["waiting"]
        assert store.recover(201.0) == []
    finally:
        store.close()
    again = SqliteStore(path)
    try:
        assert again.recover(300.0) == []
        assert again.get("started") == lost[0]
    finally:
        again.close()


def test_a_schema_newer_than_the_code_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "herdsman.db"
    SqliteStore(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StoreError) as caught:
        SqliteStore(path)
    message = str(caught.value)
    assert f"schema version {SCHEMA_VERSION + 1}, newer than" in message
    assert f"understands ({SCHEMA_VERSION})" in message
    assert "upgrade herdsman" in message
    assert str(path) in message
    raw = sqlite3.connect(path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    finally:
        raw.close()


def test_a_new_file_gets_the_current_schema_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "herdsman.db"
    store = SqliteStore(path)
    try:
        assert store.schema_version == SCHEMA_VERSION
    finally:
        store.close()
    raw = sqlite3.connect(path)
    try:
        # The journal mode is persistent, so a fresh connection sees it too.
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indices = {
            row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }
        assert {"runs_by_status", "runs_by_finished_at", "runs_by_started_at"} <= indices
    finally:
        raw.close()


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "herdsman.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open the run ledger"):
        SqliteStore(path)


def test_a_missing_directory_is_refused_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "herdsman.db"
    with pytest.raises(StoreError, match=r"cannot open the run ledger .*missing"):
        SqliteStore(path)


def test_a_burst_of_starts_commits_once(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "herdsman.db")
    try:
        for i in range(10):
            store.submit(new(f"r{i}"), T0)
        statements: list[str] = []
        store._conn.set_trace_callback(statements.append)
        records = store.mark_running_many([(f"r{i}", None) for i in range(10)], T0 + 1)
        store._conn.set_trace_callback(None)
        assert [r.status for r in records] == [RunStatus.RUNNING] * 10
        assert statements.count("COMMIT") == 1
        assert statements.count("BEGIN IMMEDIATE") == 1
    finally:
        store.close()


def test_two_processes_racing_to_start_a_run_never_both_win(tmp_path: Path) -> None:
    path = tmp_path / "herdsman.db"
    first, second = SqliteStore(path), SqliteStore(path)
    try:
        run_ids = [f"r{i}" for i in range(30)]
        for run_id in run_ids:
            first.submit(new(run_id), T0)
        wins: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
        conflicts: list[str] = []
        barrier = threading.Barrier(2)

        def race(store: SqliteStore, name: str) -> None:
            barrier.wait()
            for run_id in run_ids:
                try:
                    store.mark_running(run_id, T0 + 1, name)
                    wins[run_id].append(name)
                except StoreConflict:
                    conflicts.append(run_id)

        threads = [
            threading.Thread(target=race, args=(first, "first")),
            threading.Thread(target=race, args=(second, "second")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(len(winners) == 1 for winners in wins.values())
        assert sorted(conflicts) == sorted(run_ids)
        for run_id, winners in wins.items():
            record = first.get(run_id)
            assert record is not None
            assert (record.account, record.attempts) == (winners[0], 1)
    finally:
        first.close()
        second.close()


async def test_many_worker_threads_share_one_store(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "herdsman.db")
    try:

        async def submit_and_start(run_id: str) -> None:
            await trio.to_thread.run_sync(store.submit, new(run_id), T0)
            await trio.to_thread.run_sync(store.mark_running, run_id, T0 + 1, None)

        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(submit_and_start, f"r{i}")
        runs = store.list_runs(limit=100)
        assert sorted(r.seq for r in runs) == list(range(1, 41))
        assert store.counts()[RunStatus.RUNNING] == 40
    finally:
        store.close()


def test_starts_commit_with_full_sync_and_other_changes_with_normal(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "herdsman.db")
    statements: list[str] = []
    try:
        store._conn.set_trace_callback(statements.append)

        def sync_level_at_commit() -> int:
            level: int = store._conn.execute("PRAGMA synchronous").fetchone()[0]
            return level

        store.submit(NewRun(id="r1", provider="p", prompt="x"), 1.0)
        assert sync_level_at_commit() == 1  # NORMAL
        store.mark_running_many([("r1", None)], 2.0)
        assert sync_level_at_commit() == 2  # FULL: on disk before the spawn
        pragma_then_begin = [
            s for s in statements if s.startswith(("PRAGMA synchronous =", "BEGIN"))
        ]
        assert pragma_then_begin[-2:] == ["PRAGMA synchronous = FULL", "BEGIN IMMEDIATE"]
        store.finish("r1", RunEnd(RunStatus.SUCCEEDED), 3.0)
        assert sync_level_at_commit() == 1
    finally:
        store.close()


def test_a_version_1_file_is_migrated_and_keeps_its_runs(tmp_path: Path) -> None:
    from herdsman.runtime.store.sqlite import MIGRATIONS

    path = tmp_path / "herdsman.db"
    old = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        old.execute(statement)
    old.execute(
        "INSERT INTO runs (id, provider, prompt, workspace, metadata, status, submitted_at,"
        " attempts) VALUES ('r1', 'p', 'x', 'default', '{}', 'queued', 1.0, 0)"
    )
    old.execute("PRAGMA user_version = 1")
    old.commit()
    old.close()
    store = SqliteStore(path)
    try:
        assert store.schema_version == SCHEMA_VERSION == 9
        record = store.get("r1")
        assert record is not None
        assert (record.status, record.notes, record.cwd) == (RunStatus.QUEUED, (), None)
        assert store.add_note("r1", "hello").notes == ("hello",)
    finally:
        store.close()


def test_a_version_3_file_is_migrated_and_keeps_its_runs_and_sessions(tmp_path: Path) -> None:
    from herdsman.runtime.store.sqlite import MIGRATIONS

    path = tmp_path / "herdsman.db"
    old = sqlite3.connect(path)
    for statements in MIGRATIONS[:3]:
        for statement in statements:
            old.execute(statement)
    old.execute(
        "INSERT INTO runs (id, provider, prompt, workspace, metadata, status, submitted_at,"
        " started_at, finished_at, account, attempts, cwd, exit_code) VALUES"
        " ('r1', 'p', 'x', 'default', '{}', 'succeeded', 1.0, 2.0, 3.0, 'acct', 1, '/srv', 0),"
        " ('r2', 'p', 'x', 'default', '{}', 'running', 1.0, 4.0, NULL, 'acct', 1, NULL, NULL)"
    )
    old.execute(
        "INSERT INTO conversation_sessions (provider, workspace, conversation, session_id)"
        " VALUES ('p', 'default', 'c', 'sess')"
    )
    old.execute("PRAGMA user_version = 3")
    old.commit()
    old.close()
    store = SqliteStore(path)
    try:
        assert store.schema_version == SCHEMA_VERSION == 9
        record = store.get("r1")
        assert record is not None
        assert (record.status, record.account, record.cwd) == (
            RunStatus.SUCCEEDED,
            "acct",
            "/srv",
        )
        # A session from before accounts were tracked lives in the ambient environment.
        assert store.conversation_session("p", "default", "c") == Session(
            "p", "default", "c", "sess", None
        )
        assert store.sessions() == [Session("p", "default", "c", "sess", None)]
        assert store.account_usage(2.5) == [
            AccountUse("p", "acct", 2.0, 3.0),
            AccountUse("p", "acct", 4.0, None),
        ]
        assert store.account_limits(0.0) == []
        store.set_account_limit("p", None, 10.0, "limited")
        assert store.account_limits(0.0) == [AccountLimit("p", None, 10.0, "limited")]
        store.set_conversation_session("p", "default", "c", "sess-2", "acct")
        assert store.sessions() == [Session("p", "default", "c", "sess-2", "acct")]
    finally:
        store.close()
    raw = sqlite3.connect(path)
    try:
        indices = {
            row[0] for row in raw.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }
        assert "runs_by_started_at" in indices
    finally:
        raw.close()


def test_the_ambient_account_limit_is_keyed_by_an_empty_name_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "herdsman.db"
    store = SqliteStore(path)
    try:
        store.set_account_limit("claude", None, T0 + 10, "ambient")
        store.set_account_limit("claude", None, T0 + 20, "ambient again")
        store.set_account_limit("claude", "acct", T0 + 10, "named")
    finally:
        store.close()
    raw = sqlite3.connect(path)
    try:
        rows = raw.execute(
            "SELECT provider, account, until, message FROM account_limits ORDER BY account"
        ).fetchall()
    finally:
        raw.close()
    # One ambient row despite two writes: '' makes the primary key hold (NULLs would not).
    assert rows == [("claude", "", T0 + 20, "ambient again"), ("claude", "acct", T0 + 10, "named")]


def test_account_usage_searches_indices_instead_of_scanning_runs(tmp_path: Path) -> None:
    from herdsman.runtime.store.queries import ACCOUNT_USAGE

    store = SqliteStore(tmp_path / "herdsman.db")
    try:
        plan = [
            row[3]
            for row in store._conn.execute(
                f"EXPLAIN QUERY PLAN {ACCOUNT_USAGE}",
                (
                    RunStatus.LOST.value,
                    T0,
                    T0,
                    RunStatus.RUNNING.value,
                    RunStatus.RUNNING.value,
                    RunStatus.LOST.value,
                ),
            )
        ]
    finally:
        store.close()
    assert not [step for step in plan if step.startswith("SCAN")], plan
    assert any("runs_by_started_at" in step for step in plan), plan
    assert any("runs_by_finished_at" in step for step in plan), plan
    assert any("runs_by_status" in step for step in plan), plan
