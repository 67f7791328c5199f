"""Differential test: random operation sequences against a real store and MemoryStore.

Every operation runs on both stores; their answers (records, or the error's
type and message) must be identical after every step. The real store is
SqliteStore (a file per example) or PostgresStore (a schema of its own,
emptied for each example).
The contract suite checks chosen cases; this one looks for the cases nobody
thought of.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from outcome import Error, Outcome, Value

from herdsman.runtime.store import (
    MemoryStore,
    NewRun,
    RunEnd,
    RunStatus,
    Session,
    SqliteStore,
    Store,
)
from herdsman.runtime.store.postgres import PostgresStore

# Few ids, so operations keep colliding with runs that exist and with each other.
run_ids = st.sampled_from(["a", "b", "c", "d", "e", "f"])
small_text = st.text(max_size=6)
maybe_text = st.none() | small_text
names = st.sampled_from(["p", "q"])
conversations = st.none() | st.sampled_from(["c1", "c2"])
workspaces = st.sampled_from(["default", "w2"])
# Bounded but not rounded: floats must come back bit for bit from the database.
times = st.floats(min_value=0, max_value=2e9, allow_nan=False)
json_leaf = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | times | small_text
json_values = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(small_text, inner, max_size=3),
    max_leaves=6,
)
metadata = st.dictionaries(small_text, json_values, max_size=3)
new_runs = st.builds(
    NewRun,
    id=run_ids,
    provider=names,
    prompt=small_text,
    conversation=conversations,
    agent=st.none() | names,
    workspace=workspaces,
    callback_url=maybe_text,
    metadata=metadata,
)


session_keys = st.tuples(names, workspaces, st.sampled_from(["c1", "c2"]))
limit_accounts = st.none() | st.sampled_from(["a", "b"])
# Store calls an operation may make before it fails: every kind of change.
changes = st.one_of(
    st.builds(lambda r, n, a: lambda s: s.mark_running(r, n, a), run_ids, times, maybe_text),
    st.builds(
        lambda r, status, n: lambda s: s.finish(r, RunEnd(status, reason="undone"), n),
        run_ids,
        st.sampled_from(RunStatus),
        times,
    ),
    st.builds(lambda r, n: lambda s: s.cancel_queued(r, n, "undone"), run_ids, times),
    st.builds(lambda r: lambda s: s.requeue(r), run_ids),
    st.builds(lambda r: lambda s: s.add_note(r, "undone"), run_ids),
    st.builds(lambda n: lambda s: s.recover(n), times),
    st.builds(lambda n: lambda s: s.prune(n), times),
    st.builds(
        lambda k, sid, a: lambda s: s.set_conversation_session(*k, sid, a),
        session_keys,
        maybe_text,
        st.none() | names,
    ),
    st.builds(
        lambda p, a, u: lambda s: s.set_account_limit(p, a, u, "undone"),
        names,
        limit_accounts,
        times,
    ),
    st.builds(lambda p, a: lambda s: s.clear_account_limit(p, a), names, limit_accounts),
)
# New runs too, where an undone insert gives its seq back (SQLite; not
# PostgreSQL, whose identity sequence never goes back).
changes_with_new_runs = changes | st.builds(
    lambda new, n: lambda s: s.submit(new, n), new_runs, times
)


def ledger_state(store: Store) -> tuple[Any, ...]:
    """Everything a store answers about its ledger, to compare before and after."""
    return (
        store.list_runs(limit=1000),
        store.queued_in_order(),
        dict(store.counts()),
        store.sessions(),
        store.account_limits(-1.0),
        store.account_usage(0.0),
    )


def outcome(call: Callable[[Store], Any], store: Store) -> tuple[str, Any]:
    """What a call returned, or which error it raised with which message."""
    try:
        return ("ok", call(store))
    except Exception as exc:
        return ("error", (type(exc).__name__, str(exc)))


def settled(result: Outcome[Any]) -> tuple[str, Any]:
    """An ``apply`` slot in the form :func:`outcome` gives: comparable across stores."""
    if isinstance(result, Value):
        return ("ok", result.value)
    assert isinstance(result, Error)
    return ("error", (type(result.error).__name__, str(result.error)))


class StoresAgree(RuleBasedStateMachine):
    """Drives both stores with the same operations and compares every answer."""

    #: Whether an undone submit gives its seq back (SQLite does; PostgreSQL does not).
    reuses_seq = True

    def __init__(self, open_real: Callable[[ExitStack], Store]) -> None:
        super().__init__()
        self.resources = ExitStack()
        self.real = open_real(self.resources)
        self.memory = MemoryStore()

    def both(self, call: Callable[[Store], Any]) -> Any:
        expected = outcome(call, self.real)
        actual = outcome(call, self.memory)
        assert actual == expected
        return expected

    @rule(new=new_runs, now=times)
    def submit(self, new: NewRun, now: float) -> None:
        self.both(lambda s: s.submit(new, now))

    @rule(new=new_runs, now=times, reason=small_text)
    def skip(self, new: NewRun, now: float, reason: str) -> None:
        self.both(lambda s: s.skip(new, now, reason))

    @rule(run_id=run_ids, now=times, account=st.none() | names)
    def mark_running(self, run_id: str, now: float, account: str | None) -> None:
        self.both(lambda s: s.mark_running(run_id, now, account))

    # Runs that reach running with an account feed account_usage and the
    # usage-limit batch; one step instead of two makes them common enough.
    @rule(new=new_runs, now=times, account=names)
    def submit_and_start(self, new: NewRun, now: float, account: str) -> None:
        self.both(lambda s: s.submit(new, now))
        self.both(lambda s: s.mark_running(new.id, now, account))

    @rule(items=st.lists(st.tuples(run_ids, st.none() | names), max_size=4), now=times)
    def mark_running_many(self, items: list[tuple[str, str | None]], now: float) -> None:
        self.both(lambda s: s.mark_running_many(items, now))

    @rule(
        run_id=run_ids,
        status=st.sampled_from(RunStatus),
        now=times,
        exit_code=st.none() | st.integers(-255, 255),
        texts=st.tuples(maybe_text, maybe_text, maybe_text, maybe_text, maybe_text),
    )
    def finish(
        self,
        run_id: str,
        status: RunStatus,
        now: float,
        exit_code: int | None,
        texts: tuple[str | None, ...],
    ) -> None:
        reason, result, session_id, excerpt, log_path = texts
        self.both(
            lambda s: s.finish(
                run_id,
                RunEnd(
                    status,
                    exit_code=exit_code,
                    reason=reason,
                    result=result,
                    session_id=session_id,
                    excerpt=excerpt,
                    log_path=log_path,
                ),
                now,
            )
        )

    @rule(run_id=run_ids, now=times, reason=small_text)
    def cancel_queued(self, run_id: str, now: float, reason: str) -> None:
        self.both(lambda s: s.cancel_queued(run_id, now, reason))

    @rule(run_id=run_ids)
    def requeue(self, run_id: str) -> None:
        self.both(lambda s: s.requeue(run_id))

    @rule(now=times)
    def recover(self, now: float) -> None:
        self.both(lambda s: s.recover(now))

    @rule(before=times)
    def prune(self, before: float) -> None:
        self.both(lambda s: s.prune(before))

    @rule(
        status=st.none() | st.sampled_from(RunStatus),
        provider=st.none() | names,
        conversation=conversations,
        workspace=st.none() | workspaces,
        limit=st.integers(-1, 8),
        after_seq=st.none() | st.integers(0, 12),
        before_seq=st.none() | st.integers(0, 12),
    )
    def list_runs(
        self,
        *,
        status: RunStatus | None,
        provider: str | None,
        conversation: str | None,
        workspace: str | None,
        limit: int,
        after_seq: int | None,
        before_seq: int | None,
    ) -> None:
        self.both(
            lambda s: s.list_runs(
                status=status,
                provider=provider,
                conversation=conversation,
                workspace=workspace,
                limit=limit,
                after_seq=after_seq,
                before_seq=before_seq,
            )
        )

    @rule(
        key=st.tuples(names, workspaces, st.sampled_from(["c1", "c2"])),
        session=maybe_text,
        account=st.none() | names,
    )
    def sessions(self, key: tuple[str, str, str], session: str | None, account: str | None) -> None:
        stored = self.both(lambda s: s.set_conversation_session(*key, session, account))
        remembered = self.both(lambda s: s.conversation_session(*key))
        if stored[0] == "ok":  # not refused (a session id with NUL is)
            expected = None if session is None else Session(*key, session, account)
            assert remembered == ("ok", expected)

    # "" is in the accounts so the refusal of an empty account name is compared too.
    @rule(
        provider=names,
        account=st.none() | st.sampled_from(["", "a", "b"]),
        until=times,
        message=small_text,
    )
    def set_account_limit(
        self, provider: str, account: str | None, until: float, message: str
    ) -> None:
        self.both(lambda s: s.set_account_limit(provider, account, until, message))

    @rule(provider=names, account=st.none() | st.sampled_from(["", "a", "b"]))
    def clear_account_limit(self, provider: str, account: str | None) -> None:
        self.both(lambda s: s.clear_account_limit(provider, account))

    @rule(now=times)
    def account_limits(self, now: float) -> None:
        self.both(lambda s: s.account_limits(now))

    @rule(since=times)
    def account_usage(self, since: float) -> None:
        self.both(lambda s: s.account_usage(since))

    @rule(run_id=run_ids, now=times, session_id=maybe_text, fail=st.booleans())
    def usage_limited_batch(
        self, run_id: str, now: float, session_id: str | None, fail: bool
    ) -> None:
        """What the supervisor does on a usage limit: finish and re-queue in one batch."""

        def requeue(s: Store) -> Any:
            if fail:
                raise RuntimeError("re-queue failed")
            return s.requeue(run_id)

        def batch(s: Store) -> list[tuple[str, Any]]:
            results = s.apply(
                [
                    lambda t: t.finish(
                        run_id, RunEnd(RunStatus.USAGE_LIMITED, session_id=session_id), now
                    ),
                    requeue,
                ]
            )
            return [settled(result) for result in results]

        self.both(batch)

    @rule(data=st.data(), fail=st.booleans())
    def operation_of_many_calls(self, data: st.DataObject, fail: bool) -> None:
        """One operation of a batch making several store calls; if it raises, none stays."""
        kinds = changes_with_new_runs if self.reuses_seq else changes
        calls = data.draw(st.lists(kinds, min_size=1, max_size=5))

        def operation(s: Store) -> list[tuple[str, Any]]:
            # Each call may be refused on its own (an illegal transition);
            # the operation goes on, as one that handles the refusal would.
            done = [outcome(call, s) for call in calls]
            if fail:
                raise RuntimeError("the operation failed after its calls")
            return done

        before = (ledger_state(self.real), ledger_state(self.memory))
        self.both(lambda s: [settled(result) for result in s.apply([operation])])
        if fail:
            assert (ledger_state(self.real), ledger_state(self.memory)) == before

    @invariant()
    def same_ledger(self) -> None:
        runs = self.both(lambda s: s.list_runs(limit=1000))
        self.both(lambda s: s.queued_in_order())
        self.both(lambda s: dict(s.counts()))
        self.both(lambda s: [s.get(run_id) for run_id in "abcdef"])
        self.both(lambda s: s.sessions())
        self.both(lambda s: s.account_limits(-1.0))
        self.both(lambda s: s.account_usage(0.0))
        assert runs[0] == "ok"
        # Random list_runs arguments rarely hit the edges; walk them here.
        top = max((r.seq for r in runs[1]), default=0)
        for seq in range(top + 2):
            self.both(lambda s: s.list_runs(limit=2, before_seq=seq))  # noqa: B023
            self.both(lambda s: s.list_runs(limit=2, after_seq=seq))  # noqa: B023
        for status in RunStatus:
            self.both(lambda s: s.list_runs(status=status))  # noqa: B023

    def teardown(self) -> None:
        self.real.close()
        self.memory.close()
        self.resources.close()


AGREEMENT = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_sqlite_and_memory_agree() -> None:
    def open_sqlite(resources: ExitStack) -> Store:
        directory = resources.enter_context(tempfile.TemporaryDirectory(prefix="herdsman-store-"))
        return SqliteStore(Path(directory) / "herdsman.db")

    class SqliteAgrees(StoresAgree):
        def __init__(self) -> None:
            super().__init__(open_sqlite)

    run_state_machine_as_test(SqliteAgrees, settings=AGREEMENT)


@pytest.mark.slow
def test_postgres_and_memory_agree(postgres_url: str) -> None:
    PostgresStore(postgres_url).close()  # creates the tables

    def open_postgres(resources: ExitStack) -> Store:
        # Emptied, not made anew: a schema and its migration cost 30 times as much.
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(
                "TRUNCATE runs, run_attempts, conversation_sessions, account_limits"
                " RESTART IDENTITY"
            )
        return PostgresStore(postgres_url)

    class PostgresAgrees(StoresAgree):
        reuses_seq = False

        def __init__(self) -> None:
            super().__init__(open_postgres)

    run_state_machine_as_test(PostgresAgrees, settings=AGREEMENT)
