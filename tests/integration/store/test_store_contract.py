"""The store contract, run against every implementation.

One suite, parametrised over SqliteStore (on a real file), PostgresStore (on
a real server, a schema of its own per test) and MemoryStore: passing it is
what says the simulator's fake behaves like the real ledgers.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import outcome
import pytest

from herdsman.runtime.runner.run_usage import ModelUsage, RunUsage, Tokens
from herdsman.runtime.store import (
    LOST_ON_RESTART,
    AccountLimit,
    AccountUse,
    Attempt,
    MemoryStore,
    NewRun,
    RunEnd,
    RunNotFound,
    RunRecord,
    RunStatus,
    Session,
    SqliteStore,
    Store,
    StoreConflict,
    StoreError,
    is_terminal,
)
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.store.records import Spend

T0 = 1_700_000_000.0
Q, R, UL = RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.USAGE_LIMITED

# The lifecycle, written out here rather than read from the code under test.
EXPECTED_LEGAL = {
    (Q, R),
    (Q, RunStatus.CANCELLED),
    (Q, RunStatus.SKIPPED),
    (R, RunStatus.SUCCEEDED),
    (R, RunStatus.FAILED),
    (R, RunStatus.TIMED_OUT),
    (R, RunStatus.CANCELLED),
    (R, RunStatus.LOST),
    (R, UL),
    (UL, Q),
    # A retry of a transient failure.
    (RunStatus.FAILED, Q),
    (RunStatus.TIMED_OUT, Q),
}
# What a Claude Code run's stream says it spent, and what the ledger keeps of it.
SPENDING = RunUsage(
    tokens=Tokens(input=120, cache_read=4096, cache_write=512, output=56),
    cost_usd=0.0123,
    models=(
        ModelUsage("claude-haiku", Tokens(input=20, output=6), 0.0003),
        ModelUsage("claude-sonnet-\u00e9", Tokens(100, 4096, 512, 50), 0.012),
    ),
    turns=3,
    duration=9.5,
    api_time=7.25,
    retries=1,
)
SPENT = Spend(SPENDING.tokens, 0.0123, SPENDING.models, 3, 7.25)
OUTCOMES = [
    RunStatus.SUCCEEDED,
    RunStatus.FAILED,
    RunStatus.TIMED_OUT,
    RunStatus.CANCELLED,
    RunStatus.LOST,
    RunStatus.USAGE_LIMITED,
]


@pytest.fixture(params=["sqlite", "postgres", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "sqlite":
        made = SqliteStore(tmp_path / "herdsman.db")
    elif request.param == "postgres":
        made = PostgresStore(request.getfixturevalue("postgres_url"))
    else:
        made = MemoryStore()
    yield made
    made.close()


def new(run_id: str, **fields: Any) -> NewRun:
    defaults: dict[str, Any] = {"provider": "claude", "prompt": f"prompt of {run_id}"}
    return NewRun(id=run_id, **(defaults | fields))


def in_status(store: Store, run_id: str, status: RunStatus) -> RunRecord:
    """Bring a fresh run into ``status`` by the shortest legal path."""
    if status is RunStatus.SKIPPED:
        return store.skip(new(run_id), T0, "not wanted")[0]
    record, _ = store.submit(new(run_id), T0)
    if status is Q:
        return record
    record = store.mark_running(run_id, T0 + 1, "acct")
    if status is R:
        return record
    return store.finish(run_id, RunEnd(status, reason="because"), T0 + 2)


def attempt(store: Store, run_id: str, target: RunStatus) -> RunRecord:
    """Ask for ``target`` through the method that leads there."""
    if target is R:
        return store.mark_running(run_id, T0 + 10, "acct-2")
    if target is Q:
        return store.requeue(run_id)
    return store.finish(run_id, RunEnd(target, reason="why"), T0 + 10)


# --- submit and skip -------------------------------------------------------


def test_submit_records_a_queued_run_with_every_field(store: Store) -> None:
    record, created = store.submit(
        NewRun(
            id="r1",
            provider="codex",
            prompt="fix the bug",
            conversation="c1",
            agent="a1",
            workspace="ws",
            callback_url="http://example.invalid/hook",
            metadata={"ticket": 7, "tags": ["x", "y"], "nested": {"ok": True, "none": None}},
        ),
        T0,
    )
    assert created
    assert record == RunRecord(
        id="r1",
        provider="codex",
        prompt="fix the bug",
        conversation="c1",
        agent="a1",
        workspace="ws",
        callback_url="http://example.invalid/hook",
        metadata={"ticket": 7, "tags": ["x", "y"], "nested": {"ok": True, "none": None}},
        seq=1,
        status=Q,
        submitted_at=T0,
    )
    assert record.attempts == 0
    assert store.get("r1") == record


def test_submit_defaults(store: Store) -> None:
    record, _ = store.submit(NewRun(id="r", provider="claude", prompt="p"), T0)
    assert (record.conversation, record.agent, record.workspace) == (None, None, "default")
    assert (record.callback_url, record.metadata) == (None, {})


def test_seq_is_strictly_increasing_in_submission_order(store: Store) -> None:
    seqs = [store.submit(new(f"r{i}"), T0 - i)[0].seq for i in range(5)]
    seqs.append(store.skip(new("s"), T0, "no")[0].seq)
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert seqs[0] == 1


def test_submit_is_idempotent_even_when_other_fields_differ(store: Store) -> None:
    first, created = store.submit(new("r", metadata={"a": 1}), T0)
    assert created
    store.mark_running("r", T0 + 1, "acct")
    now_record = store.get("r")
    again, created_again = store.submit(
        new("r", provider="other", prompt="different", metadata={"b": 2}), T0 + 5
    )
    assert not created_again
    assert again == now_record
    assert again.seq == first.seq
    # A repeated submit does not consume a seq.
    assert store.submit(new("next"), T0)[0].seq == first.seq + 1


def test_skip_records_a_new_run_as_skipped(store: Store) -> None:
    record, created = store.skip(new("r", conversation="c"), T0, "provider disabled")
    assert created
    assert record.status is RunStatus.SKIPPED
    assert (record.reason, record.submitted_at, record.finished_at) == (
        "provider disabled",
        T0,
        T0,
    )
    assert record.started_at is None
    assert record.attempts == 0
    assert store.get("r") == record


def test_skip_of_an_existing_id_returns_the_existing_record(store: Store) -> None:
    queued, _ = store.submit(new("r"), T0)
    record, created = store.skip(new("r"), T0 + 1, "late")
    assert not created
    assert record == queued
    skipped, _ = store.skip(new("s"), T0, "first")
    assert store.submit(new("s"), T0 + 1) == (skipped, False)


def test_metadata_is_normalised_to_what_json_reads_back(store: Store) -> None:
    source: dict[str, Any] = {"pair": (1, 2), "float": 1.5, "deep": [{"k": (None,)}]}
    record, _ = store.submit(new("r", metadata=source), T0)
    assert record.metadata == {"pair": [1, 2], "float": 1.5, "deep": [{"k": [None]}]}
    # The store kept its own copy: changing the caller's dict changes nothing.
    source["pair"] = "changed"
    assert store.get("r") == record


def test_empty_and_look_alike_metadata_and_notes_read_back_as_written(store: Store) -> None:
    store.submit(new("a"), T0)
    store.submit(new("b", metadata={"k": {}}), T0)
    first = store.get("a")
    assert first is not None
    assert (first.metadata, first.notes) == ({}, ())
    assert [r.metadata for r in store.list_runs()] == [{"k": {}}, {}]
    assert store.add_note("a", "[]").notes == ("[]",)
    assert store.get("a") == attrs.evolve(first, notes=("[]",))


@pytest.mark.parametrize("bad", [{"x": float("nan")}, {"x": {1, 2}}, {"x": object()}])
def test_metadata_that_is_not_json_is_refused(store: Store, bad: dict[str, Any]) -> None:
    with pytest.raises(StoreError, match=r"metadata of run 'r' is not JSON"):
        store.submit(new("r", metadata=bad), T0)
    assert store.get("r") is None
    assert store.submit(new("ok"), T0)[0].seq == 1


@pytest.mark.parametrize(
    ("bad", "problem", "in_prompt"),
    [
        ("\ud800", "is not valid UTF-8", "is not valid UTF-8"),
        ("\0", "contains a NUL character", r"contains a NUL character \(at index 1\)"),
    ],
    ids=["lone surrogate", "NUL"],
)
def test_text_a_database_cannot_hold_is_refused_everywhere(
    store: Store, bad: str, problem: str, in_prompt: str
) -> None:
    # SQLite cannot hold lone surrogates, PostgreSQL cannot hold NUL: every
    # store refuses both, so all of them read alike.
    with pytest.raises(StoreError, match=rf"^prompt of run 'r' {in_prompt}"):
        store.submit(new("r", prompt=f"a{bad}b"), T0)
    assert store.get("r") is None
    store.submit(new("r"), T0)
    store.mark_running("r", T0, None)
    refused: list[tuple[str, Callable[[], object]]] = [
        (
            "result of run 'r'",
            lambda: store.finish("r", RunEnd(RunStatus.SUCCEEDED, result=bad), T0),
        ),
        (
            "excerpt of run 'r'",
            lambda: store.finish("r", RunEnd(RunStatus.FAILED, excerpt=bad), T0),
        ),
        ("note of run 'r'", lambda: store.add_note("r", bad)),
        (
            "message of the account limit of 'p'/'a'",
            lambda: store.set_account_limit("p", "a", T0, bad),
        ),
        ("session_id of run 'c'", lambda: store.set_conversation_session("p", "w", "c", bad)),
    ]
    for field, call in refused:
        with pytest.raises(StoreError, match=rf"^{re.escape(field)} {problem}"):
            call()
    assert store.get("r").status is R  # type: ignore[union-attr]
    assert store.account_limits(T0 - 1) == []
    assert store.sessions() == []
    # Metadata goes through JSON escapes, so it may hold both.
    record, _ = store.submit(new("m", metadata={"s": bad}), T0)
    assert record.metadata == {"s": bad}
    assert store.get("m") == record


@pytest.mark.parametrize("now", [float("nan"), float("inf"), -float("inf")])
def test_timestamps_must_be_finite(store: Store, now: float) -> None:
    with pytest.raises(StoreError, match="finite"):
        store.submit(new("r"), now)
    assert store.get("r") is None


@pytest.mark.parametrize("now", [float("nan"), float("inf"), -float("inf")])
def test_a_start_and_a_finish_need_a_finite_time_too(store: Store, now: float) -> None:
    store.submit(new("r"), T0)
    with pytest.raises(StoreError, match="finite"):
        store.mark_running_many([("r", None)], now)
    store.mark_running("r", T0, None)
    with pytest.raises(StoreError, match="finite"):
        store.finish("r", RunEnd(RunStatus.FAILED), now)
    assert store.get("r").status is R  # type: ignore[union-attr]


class Moment(float):
    """A float of a subclass: stored as a plain float, as an int is."""


def test_every_state_change_stores_its_time_as_a_plain_float(store: Store) -> None:
    store.submit(new("r"), Moment(T0))
    store.mark_running_many([("r", None)], int(T0) + 1)
    store.finish("r", RunEnd(RunStatus.FAILED), Moment(T0 + 2))
    for record in (store.get("r"), store.list_runs()[0]):
        assert record is not None
        times = (record.submitted_at, record.started_at, record.finished_at)
        assert [type(t) for t in times] == [float, float, float]
        assert times == (T0, T0 + 1, T0 + 2)


def test_integer_timestamps_read_back_as_floats(store: Store) -> None:
    record, _ = store.submit(new("r"), 1_700_000_000)
    assert type(record.submitted_at) is float
    assert type(store.get("r").submitted_at) is float  # type: ignore[union-attr]


# --- starting --------------------------------------------------------------


def test_mark_running_starts_a_queued_run(store: Store) -> None:
    store.submit(new("r"), T0)
    record = store.mark_running("r", T0 + 3, "work-account")
    assert (record.status, record.started_at, record.account, record.attempts) == (
        R,
        T0 + 3,
        "work-account",
        1,
    )
    assert record.finished_at is None
    assert store.get("r") == record


def test_mark_running_many_starts_all_in_the_order_given(store: Store) -> None:
    for run_id in ("a", "b", "c"):
        store.submit(new(run_id), T0)
    records = store.mark_running_many([("c", "x"), ("a", None), ("b", "y")], T0 + 1)
    assert [(r.id, r.account, r.status) for r in records] == [
        ("c", "x", R),
        ("a", None, R),
        ("b", "y", R),
    ]
    assert [store.get(i) for i in ("c", "a", "b")] == records
    assert store.mark_running_many([], T0) == []


@pytest.mark.parametrize(
    ("items", "error", "message"),
    [
        ([("a", None), ("b", None), ("a", None)], StoreConflict, "run 'a' is running"),
        ([("a", None), ("ghost", None)], RunNotFound, "no run with id 'ghost'"),
        ([("a", None), ("done", None)], StoreConflict, "run 'done' is succeeded"),
    ],
)
def test_mark_running_many_is_all_or_nothing(
    store: Store, items: list[tuple[str, str | None]], error: type[Exception], message: str
) -> None:
    store.submit(new("a"), T0)
    store.submit(new("b"), T0)
    in_status(store, "done", RunStatus.SUCCEEDED)
    before = store.list_runs()
    with pytest.raises(error, match=message):
        store.mark_running_many(items, T0 + 1)
    assert store.list_runs() == before
    assert [r.id for r in store.queued_in_order()] == ["a", "b"]


# --- every transition ------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "target"),
    list(itertools.product(RunStatus, RunStatus)),
    ids=lambda s: s.value,
)
def test_every_transition_is_legal_exactly_as_the_lifecycle_says(
    store: Store, current: RunStatus, target: RunStatus
) -> None:
    before = in_status(store, "r", current)
    assert before.status is current
    if (current, target) in EXPECTED_LEGAL:
        after = attempt(store, "r", target)
        assert after.status is target
        assert store.get("r") == after
        assert after.seq == before.seq
    else:
        with pytest.raises(StoreConflict) as caught:
            attempt(store, "r", target)
        message = str(caught.value)
        assert f"run 'r' is {current.value}" in message
        assert f"cannot become {target.value}" in message
        assert store.get("r") == before


@pytest.mark.parametrize("status", [Q, R])
def test_finish_takes_only_outcomes(store: Store, status: RunStatus) -> None:
    before = in_status(store, "r", R)
    with pytest.raises(StoreError, match=f"finish\\(\\) takes an outcome status, not {status}"):
        store.finish("r", RunEnd(status), T0)
    assert store.get("r") == before


@pytest.mark.parametrize("status", OUTCOMES)
def test_finish_records_the_outcome(store: Store, status: RunStatus) -> None:
    in_status(store, "r", R)
    record = store.finish(
        "r",
        RunEnd(
            status,
            exit_code=3,
            reason="why",
            result="the reply",
            session_id="sess-1",
            excerpt="last lines",
            log_path="/logs/r.log",
        ),
        T0 + 9,
    )
    assert (record.status, record.finished_at, record.started_at) == (status, T0 + 9, T0 + 1)
    assert (record.exit_code, record.reason, record.result) == (3, "why", "the reply")
    assert (record.session_id, record.excerpt, record.log_path) == (
        "sess-1",
        "last lines",
        "/logs/r.log",
    )
    assert record.account == "acct"
    assert store.get("r") == record


def every_field_set(status: RunStatus) -> RunEnd:
    """A :class:`RunEnd` with every field set to a value of its own, whatever fields it has."""
    values: dict[str, Any] = {"usage": SPENDING}
    for field in attrs.fields(RunEnd)[1:]:
        if field.name == "usage":
            continue
        kind = str(field.type)
        values[field.name] = len(values) + 7 if kind.startswith("int") else f"{field.name}!"
    return RunEnd(status, **values)


def test_finish_records_every_field_of_the_end_as_given(store: Store) -> None:
    """Each field of the end lands in the record's field of its name; None clears one."""
    store.submit(new("r"), T0)
    store.mark_running("r", T0 + 1, "acct")
    end = every_field_set(UL)
    store.apply([lambda s: (s.finish("r", end, T0 + 2), s.requeue("r"))])
    store.mark_running("r", T0 + 3, "acct")
    record = store.finish("r", end, T0 + 4)
    for name in attrs.fields_dict(RunEnd):
        if name != "usage":  # kept as the record's spend
            assert getattr(record, name) == getattr(end, name), name
    assert record.spend == SPENT
    assert (record.finished_at, record.started_at, record.attempts) == (T0 + 4, T0 + 3, 2)
    assert store.get("r") == record
    store.requeue("r")
    store.mark_running("r", T0 + 5, "acct")
    cleared = store.finish("r", RunEnd(RunStatus.FAILED), T0 + 6)
    for name in list(attrs.fields_dict(RunEnd))[1:]:
        if name != "usage":
            assert getattr(cleared, name) is None, name
    assert cleared.spend is None
    assert store.get("r") == cleared


def test_a_queued_run_may_be_finished_as_skipped(store: Store) -> None:
    store.submit(new("r"), T0)
    record = store.finish("r", RunEnd(RunStatus.SKIPPED, reason="provider removed"), T0 + 1)
    assert (record.status, record.finished_at, record.started_at, record.attempts) == (
        RunStatus.SKIPPED,
        T0 + 1,
        None,
        0,
    )


def test_cancel_queued(store: Store) -> None:
    store.submit(new("r"), T0)
    record = store.cancel_queued("r", T0 + 4, "user asked")
    assert (record.status, record.reason, record.finished_at) == (
        RunStatus.CANCELLED,
        "user asked",
        T0 + 4,
    )
    assert store.get("r") == record
    assert store.queued_in_order() == []


@pytest.mark.parametrize("status", [s for s in RunStatus if s is not Q])
def test_cancel_queued_refuses_any_run_not_queued(store: Store, status: RunStatus) -> None:
    before = in_status(store, "r", status)
    with pytest.raises(StoreConflict, match=f"run 'r' is {status.value}; it cannot become"):
        store.cancel_queued("r", T0 + 4, "too late")
    assert store.get("r") == before


def test_requeue_clears_the_attempt_and_keeps_its_place(store: Store) -> None:
    store.submit(new("first"), T0)
    in_status(store, "r", UL)
    store.submit(new("later"), T0)
    record = store.requeue("r")
    assert record.status is Q
    assert (record.started_at, record.finished_at, record.account, record.reason) == (
        None,
        None,
        None,
        None,
    )
    assert record.attempts == 1
    assert [r.id for r in store.queued_in_order()] == ["first", "r", "later"]
    again = store.mark_running("r", T0 + 20, "acct-2")
    assert again.attempts == 2


def test_every_change_of_a_run_reads_back_as_returned(store: Store) -> None:
    # Each transition writes only the columns it changes: what is read back,
    # and what the indexed queries find, must still be the whole record.
    store.submit(new("r"), T0)
    limited: dict[str, Any] = {"exit_code": 1, "reason": "limit", "result": "no"}
    limited |= {"session_id": "s", "excerpt": "x", "log_path": "/l"}
    steps: list[Callable[[], RunRecord]] = [
        lambda: store.mark_running("r", T0 + 1, "a"),
        lambda: store.finish("r", RunEnd(UL, **limited), T0 + 2),
        lambda: store.requeue("r"),
        lambda: store.mark_running("r", T0 + 3, None),
        lambda: store.finish("r", RunEnd(RunStatus.SUCCEEDED, exit_code=0, result="ok"), T0 + 4),
    ]
    for step in steps:
        record = step()
        assert store.get("r") == record
        assert store.list_runs(status=record.status) == [record]
    assert store.prune(T0 + 4) == 0
    assert store.prune(T0 + 5) == 1


def test_requeue_keeps_the_session(store: Store) -> None:
    store.submit(new("r"), T0)
    store.mark_running("r", T0, "a")
    store.finish(
        "r", RunEnd(UL, session_id="sess", exit_code=1, result="limit", excerpt="x"), T0 + 1
    )
    record = store.requeue("r")
    assert record.session_id == "sess"
    assert (record.exit_code, record.result, record.excerpt, record.log_path) == (
        None,
        None,
        None,
        None,
    )


def test_state_changes_on_unknown_runs_raise_run_not_found(store: Store) -> None:
    calls: list[Callable[[], object]] = [
        lambda: store.mark_running("ghost", T0, None),
        lambda: store.mark_running_many([("ghost", None)], T0),
        lambda: store.finish("ghost", RunEnd(RunStatus.FAILED), T0),
        lambda: store.cancel_queued("ghost", T0, "x"),
        lambda: store.requeue("ghost"),
    ]
    for call in calls:
        with pytest.raises(RunNotFound, match="no run with id 'ghost'"):
            call()
    assert store.get("ghost") is None
    assert issubclass(RunNotFound, StoreError)
    assert issubclass(StoreConflict, StoreError)


def test_a_key_holding_nul_finds_nothing_in_every_store(store: Store) -> None:
    # No stored key holds NUL (every store refuses it on the way in), so a
    # lookup by one is an unknown key, not a database error, on every store.
    store.submit(new("r1", conversation="c1"), T0)
    ghost = "r1\0"
    calls: list[Callable[[], object]] = [
        lambda: store.mark_running(ghost, T0, None),
        lambda: store.mark_running_many([(ghost, None)], T0),
        lambda: store.finish(ghost, RunEnd(RunStatus.FAILED), T0),
        lambda: store.cancel_queued(ghost, T0, "x"),
        lambda: store.requeue(ghost),
        lambda: store.add_note(ghost, "note"),
    ]
    for call in calls:
        with pytest.raises(RunNotFound):
            call()
    assert store.get(ghost) is None
    assert store.list_runs(conversation="c1\0") == []
    assert store.list_runs(provider="claude\0", workspace="default\0") == []
    assert store.conversation_session("claude", "default", "c1\0") is None
    assert [r.id for r in store.list_runs()] == ["r1"]


# --- queries ---------------------------------------------------------------


def populate(store: Store) -> None:
    """Six runs across providers, conversations, workspaces and statuses."""
    store.submit(new("r1", provider="claude", conversation="c1"), T0)
    store.submit(new("r2", provider="codex", conversation="c1", workspace="w2"), T0)
    store.submit(new("r3", provider="claude", conversation="c2"), T0)
    store.submit(new("r4", provider="claude"), T0)
    store.skip(new("r5", provider="codex", conversation="c1"), T0, "no")
    store.submit(new("r6", provider="claude", conversation="c1"), T0)
    store.mark_running("r3", T0 + 1, None)
    store.mark_running("r1", T0 + 1, None)
    store.finish("r1", RunEnd(RunStatus.SUCCEEDED), T0 + 2)


def ids(records: list[RunRecord]) -> list[str]:
    return [r.id for r in records]


def test_list_runs_is_newest_first_and_filters(store: Store) -> None:
    populate(store)
    assert ids(store.list_runs()) == ["r6", "r5", "r4", "r3", "r2", "r1"]
    assert ids(store.list_runs(status=Q)) == ["r6", "r4", "r2"]
    assert ids(store.list_runs(provider="codex")) == ["r5", "r2"]
    assert ids(store.list_runs(conversation="c1")) == ["r6", "r5", "r2", "r1"]
    assert ids(store.list_runs(workspace="w2")) == ["r2"]
    assert ids(store.list_runs(conversation="c1", workspace="default", provider="claude")) == [
        "r6",
        "r1",
    ]
    assert ids(store.list_runs(status=RunStatus.SUCCEEDED, provider="codex")) == []
    assert store.list_runs(status=R) == [store.get("r3")]


def test_list_runs_limit_and_cursors(store: Store) -> None:
    populate(store)
    assert ids(store.list_runs(limit=2)) == ["r6", "r5"]
    assert store.list_runs(limit=0) == []
    assert ids(store.list_runs(after_seq=4)) == ["r6", "r5"]
    assert ids(store.list_runs(before_seq=3)) == ["r2", "r1"]
    assert ids(store.list_runs(after_seq=1, before_seq=4)) == ["r3", "r2"]
    # Paging newest to oldest with before_seq visits every run once.
    pages: list[list[str]] = []
    cursor: int | None = None
    while page := store.list_runs(limit=4, before_seq=cursor):
        pages.append(ids(page))
        cursor = page[-1].seq
    assert pages == [["r6", "r5", "r4", "r3"], ["r2", "r1"]]
    with pytest.raises(StoreError, match="limit must be 0 or more"):
        store.list_runs(limit=-1)


def test_queued_in_order_is_submission_order(store: Store) -> None:
    for i in range(5):
        store.submit(new(f"r{i}"), T0 + 10 - i)  # submitted_at deliberately decreasing
    store.mark_running("r1", T0, None)
    store.cancel_queued("r3", T0, "no")
    assert ids(store.queued_in_order()) == ["r0", "r2", "r4"]
    assert store.queued_in_order() == [store.get(i) for i in ("r0", "r2", "r4")]


# --- recovery and pruning --------------------------------------------------


def test_recover_marks_every_running_run_lost_and_never_requeues(store: Store) -> None:
    populate(store)
    in_status(store, "limited", UL)
    store.submit(new("late"), T0)
    store.mark_running("late", T0 + 3, "acct")
    queued_before = store.queued_in_order()
    lost = store.recover(T0 + 100)
    assert ids(lost) == ["r3", "late"]
    for record in lost:
        assert record.status is RunStatus.LOST
        assert record.reason == "supervisor restarted before this run finished"
        assert record.reason == LOST_ON_RESTART
        assert record.finished_at == T0 + 100
        assert record.attempts == 1
        assert store.get(record.id) == record
    assert store.get("late").account == "acct"  # type: ignore[union-attr]
    assert store.queued_in_order() == queued_before
    assert store.get("limited").status is UL  # type: ignore[union-attr]
    assert store.recover(T0 + 200) == []


def test_prune_deletes_terminal_runs_finished_before_the_time(store: Store) -> None:
    for status in RunStatus:
        in_status(store, f"old-{status.value}", status)
    store.submit(new("fresh"), T0)
    store.mark_running("fresh", T0, None)
    store.finish("fresh", RunEnd(RunStatus.FAILED), T0 + 50)
    # Terminal runs above finished at T0 + 2 (skipped at T0); T0 + 2 is not before it.
    assert store.prune(T0 + 2) == 1
    assert store.get("old-skipped") is None
    # usage_limited is terminal: a run left in it was not re-queued, and never will be.
    assert store.prune(T0 + 3) == 6
    assert store.get("old-usage_limited") is None
    survivors = {r.id for r in store.list_runs()}
    assert survivors == {"old-queued", "old-running", "fresh"}
    assert store.prune(T0 + 3) == 0
    assert store.prune(T0 + 51) == 1
    assert store.counts()[RunStatus.FAILED] == 0


def test_seq_is_never_reused_after_prune(store: Store) -> None:
    in_status(store, "a", RunStatus.SUCCEEDED)
    last = in_status(store, "b", RunStatus.SUCCEEDED)
    assert store.prune(T0 + 1000) == 2
    assert store.submit(new("c"), T0)[0].seq == last.seq + 1
    # A pruned id is forgotten: submitting it again makes a new run.
    record, created = store.submit(new("a"), T0)
    assert created
    assert record.seq == last.seq + 2


# --- session memory, counts, close -----------------------------------------


def session_id(store: Store, provider: str, workspace: str, conversation: str) -> str | None:
    found = store.conversation_session(provider, workspace, conversation)
    return None if found is None else found.session_id


def test_conversation_sessions_are_remembered_per_provider_workspace_conversation(
    store: Store,
) -> None:
    assert store.conversation_session("claude", "default", "c") is None
    store.set_conversation_session("claude", "default", "c", "s1")
    store.set_conversation_session("codex", "default", "c", "s2")
    store.set_conversation_session("claude", "w2", "c", "s3")
    assert session_id(store, "claude", "default", "c") == "s1"
    assert session_id(store, "codex", "default", "c") == "s2"
    assert session_id(store, "claude", "w2", "c") == "s3"
    assert store.conversation_session("claude", "default", "other") is None
    store.set_conversation_session("claude", "default", "c", "s4")
    assert session_id(store, "claude", "default", "c") == "s4"
    store.set_conversation_session("claude", "default", "c", None)
    assert store.conversation_session("claude", "default", "c") is None
    store.set_conversation_session("claude", "default", "never-set", None)
    assert session_id(store, "codex", "default", "c") == "s2"


def test_a_session_remembers_the_account_that_holds_it(store: Store) -> None:
    store.set_conversation_session("claude", "ws", "c", "s1")
    assert store.conversation_session("claude", "ws", "c") == Session(
        provider="claude", workspace="ws", conversation="c", session_id="s1", account=None
    )
    store.set_conversation_session("claude", "ws", "c", "s2", account="work")
    assert store.conversation_session("claude", "ws", "c") == Session(
        "claude", "ws", "c", "s2", "work"
    )
    # Setting again replaces the account too, back to ambient included.
    store.set_conversation_session("claude", "ws", "c", "s3", "home")
    assert store.conversation_session("claude", "ws", "c") == Session(
        "claude", "ws", "c", "s3", "home"
    )
    store.set_conversation_session("claude", "ws", "c", "s4")
    assert store.conversation_session("claude", "ws", "c") == Session(
        "claude", "ws", "c", "s4", None
    )
    # Forgetting ignores the account given.
    store.set_conversation_session("claude", "ws", "c", None, account="work")
    assert store.conversation_session("claude", "ws", "c") is None
    assert store.sessions() == []


def test_a_session_account_sqlite_cannot_hold_is_refused(store: Store) -> None:
    store.set_conversation_session("claude", "ws", "c", "s1", "work")
    with pytest.raises(StoreError, match=r"account of run 'c' is not valid UTF-8"):
        store.set_conversation_session("claude", "ws", "c", "s2", "bad \ud800")
    assert store.conversation_session("claude", "ws", "c") == Session(
        "claude", "ws", "c", "s1", "work"
    )


def test_sessions_lists_every_row_by_provider_workspace_conversation(store: Store) -> None:
    assert store.sessions() == []
    store.set_conversation_session("codex", "default", "c1", "x1", "acct")
    store.set_conversation_session("claude", "w2", "c1", "x2")
    store.set_conversation_session("claude", "default", "c2", "x3", "home")
    store.set_conversation_session("claude", "default", "c1", "x4")
    store.set_conversation_session("claude", "default", "C0", "x5")
    store.set_conversation_session("claude", "default", "gone", "x6")
    store.set_conversation_session("claude", "default", "gone", None)
    assert store.sessions() == [
        Session("claude", "default", "C0", "x5", None),
        Session("claude", "default", "c1", "x4", None),
        Session("claude", "default", "c2", "x3", "home"),
        Session("claude", "w2", "c1", "x2", None),
        Session("codex", "default", "c1", "x1", "acct"),
    ]
    for found in store.sessions():
        key = (found.provider, found.workspace, found.conversation)
        assert store.conversation_session(*key) == found


# --- account limits --------------------------------------------------------


def test_account_limits_are_kept_per_provider_and_account_until_they_expire(
    store: Store,
) -> None:
    assert store.account_limits(T0) == []
    store.set_account_limit("claude", "work", T0 + 100, "limit reached")
    store.set_account_limit("claude", None, T0 + 50, "ambient limited")
    store.set_account_limit("codex", "work", T0 + 10, "codex says no")
    assert store.account_limits(T0) == [
        AccountLimit(provider="claude", account=None, until=T0 + 50, message="ambient limited"),
        AccountLimit("claude", "work", T0 + 100, "limit reached"),
        AccountLimit("codex", "work", T0 + 10, "codex says no"),
    ]
    # ``until`` is when the limit ends: at that instant it no longer holds.
    assert store.account_limits(T0 + 10) == [
        AccountLimit("claude", None, T0 + 50, "ambient limited"),
        AccountLimit("claude", "work", T0 + 100, "limit reached"),
    ]
    assert store.account_limits(T0 + 9.5)[-1].provider == "codex"
    assert store.account_limits(T0 + 100) == []
    # Expired limits are only left out, not deleted.
    assert len(store.account_limits(T0 - 1)) == 3


def test_account_limits_list_ambient_first_then_accounts_by_name(store: Store) -> None:
    for account in ("b", "A", "a", None, "-"):
        store.set_account_limit("p", account, T0 + 1, f"limit of {account}")
    store.set_account_limit("o", "z", T0 + 1, "other provider")
    assert [(lim.provider, lim.account) for lim in store.account_limits(T0)] == [
        ("o", "z"),
        ("p", None),
        ("p", "-"),
        ("p", "A"),
        ("p", "a"),
        ("p", "b"),
    ]


def test_setting_an_account_limit_again_replaces_it(store: Store) -> None:
    store.set_account_limit("claude", "work", T0 + 100, "first")
    store.set_account_limit("claude", None, T0 + 100, "ambient")
    store.set_account_limit("claude", "work", T0 + 5, "second")
    assert store.account_limits(T0) == [
        AccountLimit("claude", None, T0 + 100, "ambient"),
        AccountLimit("claude", "work", T0 + 5, "second"),
    ]
    # A limit may be moved later again, and an int time reads back as a float.
    store.set_account_limit("claude", "work", 1_700_000_200, "third")
    limits = store.account_limits(T0 + 150)
    assert limits == [AccountLimit("claude", "work", T0 + 200, "third")]
    assert type(limits[0].until) is float


def test_clear_account_limit_deletes_only_that_limit(store: Store) -> None:
    store.set_account_limit("claude", "work", T0 + 100, "w")
    store.set_account_limit("claude", None, T0 + 100, "ambient")
    store.set_account_limit("codex", "work", T0 + 100, "c")
    store.clear_account_limit("claude", None)
    assert [(lim.provider, lim.account) for lim in store.account_limits(T0)] == [
        ("claude", "work"),
        ("codex", "work"),
    ]
    store.clear_account_limit("claude", "work")
    assert [(lim.provider, lim.account) for lim in store.account_limits(T0)] == [("codex", "work")]
    # Clearing what is not there is not an error.
    store.clear_account_limit("claude", "work")
    store.clear_account_limit("nobody", None)
    assert len(store.account_limits(T0)) == 1


@pytest.mark.parametrize("until", [float("nan"), float("inf"), -float("inf")])
def test_an_account_limit_must_end_at_a_finite_time(store: Store, until: float) -> None:
    with pytest.raises(StoreError, match="finite"):
        store.set_account_limit("claude", "work", until, "m")
    with pytest.raises(StoreError, match="finite"):
        store.account_limits(until)
    assert store.account_limits(T0) == []


@pytest.mark.parametrize(
    ("provider", "account", "message", "error"),
    [
        ("claude", "work", "bad \udcff", r"message of the account limit of 'claude'/'work'"),
        ("claude", "bad \ud800", "m", r"account of the account limit of 'claude'/"),
        ("bad \ud800", None, "m", r"provider of the account limit of "),
        ("claude", "", "m", r"'claude'/'': an account name must not be empty"),
    ],
)
def test_an_account_limit_sqlite_cannot_hold_is_refused(
    store: Store, provider: str, account: str | None, message: str, error: str
) -> None:
    store.set_account_limit("claude", None, T0 + 10, "ambient")
    before = store.account_limits(T0)
    with pytest.raises(StoreError, match=error):
        store.set_account_limit(provider, account, T0 + 10, message)
    assert store.account_limits(T0) == before


def test_clearing_the_limit_of_an_empty_account_name_is_refused(store: Store) -> None:
    # '' is how SQLite keys the ambient limit; it must not clear that one.
    store.set_account_limit("claude", None, T0 + 10, "ambient")
    with pytest.raises(StoreError, match="an account name must not be empty"):
        store.clear_account_limit("claude", "")
    assert len(store.account_limits(T0)) == 1


# --- account usage ---------------------------------------------------------


def test_account_usage_counts_runs_that_touch_the_window_or_still_run(store: Store) -> None:
    def ran(run_id: str, account: str | None, start: float, end: float | None) -> None:
        store.submit(new(run_id, provider="codex" if run_id.endswith("x") else "claude"), T0)
        store.mark_running(run_id, start, account)
        if end is not None:
            store.finish(run_id, RunEnd(RunStatus.SUCCEEDED, exit_code=0), end)

    since = T0 + 100
    ran("before", "a", T0 + 10, T0 + 20)  # over before the window: not counted
    ran("across", "a", T0 + 90, T0 + 110)  # started before, finished inside
    ran("edge-end", "b", T0 + 50, since)  # finished exactly at since
    ran("edge-start-x", "a", since, None)  # started exactly at since, running
    ran("old-running", "b", T0 + 1, None)  # still running from long ago
    ran("inside", "a", T0 + 120, T0 + 130)
    ran("ambient", None, T0 + 120, T0 + 130)  # no account: not counted
    # Started, then ended before a process existed (its program was missing):
    # it spent nothing, as the account tracker counts it.
    store.submit(new("unspawned"), T0)
    store.mark_running("unspawned", T0 + 120, "a")
    store.finish("unspawned", RunEnd(RunStatus.FAILED, reason="no such program"), T0 + 121)
    store.submit(new("queued"), T0)
    store.skip(new("skipped"), T0 + 150, "no")
    assert store.account_usage(since) == [
        AccountUse("claude", "b", T0 + 1, None),
        AccountUse("claude", "b", T0 + 50, since),
        AccountUse("claude", "a", T0 + 90, T0 + 110),
        AccountUse(provider="codex", account="a", started_at=since, finished_at=None),
        AccountUse("claude", "a", T0 + 120, T0 + 130),
    ]
    assert [use.started_at for use in store.account_usage(T0)] == [
        T0 + 1,
        T0 + 10,
        T0 + 50,
        T0 + 90,
        since,
        T0 + 120,
    ]
    # Past every window: only the runs still running.
    assert [use.started_at for use in store.account_usage(T0 + 10_000)] == [T0 + 1, since]


def test_account_usage_orders_equal_starts_by_submission(store: Store) -> None:
    for run_id in ("late", "early", "mid"):
        store.submit(new(run_id), T0)
    store.mark_running_many([("mid", "m"), ("late", "l"), ("early", "e")], T0 + 5)
    store.submit(new("first"), T0)
    store.mark_running("first", T0 + 1, "f")
    assert [use.account for use in store.account_usage(T0)] == ["f", "l", "e", "m"]


def test_account_usage_keeps_lost_runs_and_requeued_attempts(store: Store) -> None:
    store.submit(new("lost"), T0)
    store.mark_running("lost", T0 + 1, "a")
    store.recover(T0 + 5)
    store.submit(new("limited"), T0)
    store.mark_running("limited", T0 + 1, "acct")
    store.finish("limited", RunEnd(UL, exit_code=1), T0 + 2)
    # A lost run is charged as ending when it started: a start, no run-minutes.
    assert [(u.account, u.finished_at) for u in store.account_usage(T0)] == [
        ("a", T0 + 1),
        ("acct", T0 + 2),
    ]
    # The re-queued attempt still counts under its account, start and end,
    # as the running book counted it: moved off its account, it is charged
    # no spend, whatever it spent.
    store.requeue("limited")
    assert store.account_usage(T0) == [
        AccountUse("claude", "a", T0 + 1, T0 + 1),
        AccountUse("claude", "acct", T0 + 1, T0 + 2),
    ]


def test_account_usage_restores_a_retried_runs_earlier_attempts(store: Store) -> None:
    # Attempt 1 on "a" fails and is retried; attempt 2 on "b" fails and is
    # retried; attempt 3 on "a" is running. Each counts under its own
    # account, start, end and spend, as the running book charged it.
    store.submit(new("r"), T0)
    store.mark_running("r", T0 + 1, "a")
    store.finish("r", RunEnd(RunStatus.FAILED, exit_code=1, usage=SPENDING), T0 + 3)
    store.requeue("r", failure="server_error", retry_at=T0 + 4)
    store.mark_running("r", T0 + 5, "b")
    store.finish("r", RunEnd(RunStatus.FAILED, exit_code=1), T0 + 8)
    store.requeue("r", failure="server_error", retry_at=T0 + 9)
    # A retry that never got a process spent nothing: not counted.
    store.mark_running("r", T0 + 10, "b")
    store.finish("r", RunEnd(RunStatus.FAILED, reason="no such program"), T0 + 10)
    store.requeue("r", failure="server_error", retry_at=T0 + 11)
    store.mark_running("r", T0 + 12, "a")
    # SPENDING's input, cache writes and output (cache reads are not budgeted).
    charged = (120 + 512 + 56, 0.0123)
    assert store.account_usage(T0) == [
        AccountUse("claude", "a", T0 + 1, T0 + 3, *charged),
        AccountUse("claude", "b", T0 + 5, T0 + 8),
        AccountUse("claude", "a", T0 + 12, None),
    ]
    # An earlier attempt over before the window is not counted.
    assert store.account_usage(T0 + 4) == [
        AccountUse("claude", "b", T0 + 5, T0 + 8),
        AccountUse("claude", "a", T0 + 12, None),
    ]


@pytest.mark.parametrize("since", [float("nan"), float("inf"), -float("inf")])
def test_account_usage_needs_a_finite_time(store: Store, since: float) -> None:
    with pytest.raises(StoreError, match="finite"):
        store.account_usage(since)


def test_counts_has_every_status(store: Store) -> None:
    assert dict(store.counts()) == dict.fromkeys(RunStatus, 0)
    assert list(store.counts()) == list(RunStatus)
    populate(store)
    in_status(store, "limited", UL)
    counts = store.counts()
    assert counts[Q] == 3
    assert counts[R] == 1
    assert counts[RunStatus.SUCCEEDED] == 1
    assert counts[RunStatus.SKIPPED] == 1
    assert counts[UL] == 1
    assert sum(counts.values()) == len(store.list_runs(limit=1000))


def test_records_are_hashable_values(store: Store) -> None:
    record, _ = store.submit(new("r", metadata={"k": [1]}), T0)
    assert not record.is_terminal
    assert hash(record) == hash(store.get("r"))
    done = store.finish("r", RunEnd(RunStatus.SKIPPED), T0)
    assert done.is_terminal


def test_is_terminal() -> None:
    assert {s for s in RunStatus if is_terminal(s)} == {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.TIMED_OUT,
        RunStatus.CANCELLED,
        RunStatus.LOST,
        RunStatus.SKIPPED,
        RunStatus.USAGE_LIMITED,
    }
    assert [s.value for s in RunStatus] == [
        "queued",
        "running",
        "succeeded",
        "failed",
        "timed_out",
        "cancelled",
        "lost",
        "skipped",
        "usage_limited",
    ]


def test_close_is_idempotent_and_final(store: Store) -> None:
    store.submit(new("r"), T0)
    store.close()
    store.close()
    calls: list[Callable[[], object]] = [
        lambda: store.get("r"),
        lambda: store.submit(new("x"), T0),
        lambda: store.mark_running("r", T0, None),
        lambda: store.mark_running_many([("r", None)], T0),
        lambda: store.finish("r", RunEnd(RunStatus.FAILED), T0),
        store.list_runs,
        store.queued_in_order,
        lambda: store.recover(T0),
        lambda: store.prune(T0),
        store.counts,
        lambda: store.conversation_session("p", "w", "c"),
        lambda: store.set_conversation_session("p", "w", "c", "s"),
        lambda: store.set_conversation_session("p", "w", "c", "s", "acct"),
        store.sessions,
        lambda: store.set_account_limit("p", None, T0, "m"),
        lambda: store.account_limits(T0),
        lambda: store.clear_account_limit("p", None),
        lambda: store.account_usage(T0),
    ]
    for call in calls:
        with pytest.raises(StoreError, match="the store is closed"):
            call()


# --- apply (group commit) --------------------------------------------------


def test_apply_runs_operations_in_order_and_returns_each_result(store: Store) -> None:
    results = store.apply(
        [
            lambda s: s.submit(new("a"), T0),
            lambda s: s.submit(new("b"), T0),
            lambda s: s.mark_running_many([("a", None)], T0 + 1),
            lambda s: s.get("a"),
        ],
        durable=True,
    )
    (a, created_a), (b, created_b) = results[0].unwrap(), results[1].unwrap()
    assert (created_a, created_b) == (True, True)
    assert a.seq < b.seq
    assert [r.status for r in results[2].unwrap()] == [R]
    seen = results[3].unwrap()
    assert seen is not None
    assert seen.status is R
    assert store.get("b") == b


def test_apply_undoes_the_whole_operation_that_failed_and_only_it(store: Store) -> None:
    store.submit(new("a"), T0)

    def half_then_fail(s: Store) -> None:
        s.submit(new("ghost"), T0)
        s.finish("a", RunEnd(RunStatus.SUCCEEDED), T0 + 1)  # a is queued, not running

    results = store.apply(
        [
            lambda s: s.cancel_queued("a", T0 + 1, "first"),
            half_then_fail,
            lambda s: s.submit(new("c"), T0 + 2),
        ]
    )
    assert results[0].unwrap().status is RunStatus.CANCELLED
    with pytest.raises(StoreConflict):
        results[1].unwrap()
    assert results[2].unwrap()[1] is True
    # An operation is all-or-nothing: the calls it made before the failing
    # one are undone with it; the operations around it stay.
    assert store.get("ghost") is None
    a = store.get("a")
    assert a is not None
    assert a.status is RunStatus.CANCELLED
    got = store.get("c")
    assert got is not None
    assert got.status is Q
    assert [r.id for r in store.queued_in_order()] == ["c"]
    assert store.counts()[Q] == 1


def test_an_operation_that_handles_a_failed_call_keeps_its_other_calls(store: Store) -> None:
    # Each store call is still all-or-nothing on its own: an operation that
    # catches a refusal goes on from where the call left the store.
    store.submit(new("a"), T0)

    def tolerant(s: Store) -> str:
        s.submit(new("b"), T0)
        try:
            s.finish("a", RunEnd(RunStatus.SUCCEEDED), T0 + 1)  # a is queued, not running
        except StoreConflict:
            s.cancel_queued("a", T0 + 1, "could not finish")
        return "done"

    (result,) = store.apply([tolerant])
    assert result.unwrap() == "done"
    a, b = store.get("a"), store.get("b")
    assert a is not None
    assert a.status is RunStatus.CANCELLED
    assert b is not None
    assert b.status is Q


def test_usage_limited_then_requeue_in_one_batch_leaves_the_run_queued(store: Store) -> None:
    store.submit(new("first"), T0)
    store.submit(new("r"), T0)
    store.submit(new("later"), T0)
    started = store.mark_running("r", T0 + 1, "acct")
    results = store.apply(
        [
            lambda s: s.finish("r", RunEnd(UL, session_id="sess", reason="limit"), T0 + 2),
            lambda s: s.requeue("r"),
        ],
        durable=True,
    )
    limited, requeued = results[0].unwrap(), results[1].unwrap()
    # The outcome recorded first is final on its own; the re-queue beside it
    # is what brings the run back.
    assert limited.status is UL
    assert limited.is_terminal
    assert requeued.status is Q
    got = store.get("r")
    assert got is not None
    assert got == requeued
    assert (got.seq, got.attempts, got.session_id) == (started.seq, 1, "sess")
    assert (got.started_at, got.finished_at, got.account, got.reason) == (None, None, None, None)
    assert [r.id for r in store.queued_in_order()] == ["first", "r", "later"]
    assert store.counts()[UL] == 0
    # Not pruned: it is queued again, no longer usage_limited.
    assert store.prune(T0 + 1000) == 0


def test_a_failed_requeue_undoes_the_finish_of_its_operation(store: Store) -> None:
    in_status(store, "r", R)

    def fail_after_finish(s: Store) -> None:
        s.finish("r", RunEnd(UL, reason="limit"), T0 + 2)
        raise RuntimeError("requeue never happened")

    results = store.apply([fail_after_finish, lambda s: s.get("r")])
    with pytest.raises(RuntimeError, match="requeue never happened"):
        results[0].unwrap()
    # The operation is undone whole: the run is running still, as before it.
    seen = results[1].unwrap()
    assert seen is not None
    assert seen.status is R
    assert seen.finished_at is None
    assert store.get("r") == seen
    assert store.prune(T0 + 3) == 0


def test_a_failed_requeue_of_its_own_leaves_a_usage_limited_run_final(store: Store) -> None:
    in_status(store, "r", R)

    def fail_to_requeue(s: Store) -> None:
        s.requeue("r")
        raise RuntimeError("requeue never happened")

    results = store.apply(
        [lambda s: s.finish("r", RunEnd(UL, reason="limit"), T0 + 2), fail_to_requeue]
    )
    with pytest.raises(RuntimeError, match="requeue never happened"):
        results[1].unwrap()
    # Another operation's finish stays: the run remains usage_limited, final.
    seen = store.get("r")
    assert seen is not None
    assert seen.status is UL
    assert seen.is_terminal
    assert store.prune(T0 + 3) == 1
    assert store.get("r") is None


def test_a_requeue_that_raises_in_the_batch_keeps_the_finish(store: Store) -> None:
    in_status(store, "r", R)
    results = store.apply(
        [
            lambda s: s.finish("r", RunEnd(UL), T0 + 2),
            lambda s: s.requeue("ghost"),  # the wrong id: raises RunNotFound
        ]
    )
    assert isinstance(results[0], outcome.Value)
    with pytest.raises(RunNotFound):
        results[1].unwrap()
    got = store.get("r")
    assert got is not None
    assert got.status is UL
    assert got.is_terminal


def test_an_apply_inside_an_operation_is_refused_and_its_batch_goes_on_whole(
    store: Store,
) -> None:
    # A batch is one transaction: an apply nested in one of its operations
    # would end it early (SQL) or commit apart from it. It is a programming
    # error, raised in that operation, which is undone whole as any other.
    store.submit(new("a"), T0)

    def nested(s: Store) -> None:
        s.submit(new("before"), T0)
        s.apply([lambda t: t.submit(new("inner"), T0)])

    def fails(s: Store) -> None:
        s.submit(new("undone"), T0)
        raise RuntimeError("fails after its submit")

    results = store.apply(
        [
            nested,
            lambda s: s.submit(new("after"), T0),
            fails,
            lambda s: s.cancel_queued("a", T0 + 1, "cancelled"),
        ]
    )
    with pytest.raises(RuntimeError, match=r"^store\.apply was called inside an operation"):
        results[0].unwrap()
    assert results[1].unwrap()[1] is True
    with pytest.raises(RuntimeError, match="fails after its submit"):
        results[2].unwrap()
    assert results[3].unwrap().status is RunStatus.CANCELLED
    assert [store.get(run_id) for run_id in ("before", "inner", "undone")] == [None] * 3
    assert [r.id for r in store.queued_in_order()] == ["after"]
    # The store is usable afterwards: a batch of its own commits as usual.
    (later,) = store.apply([lambda s: s.submit(new("later"), T0)])
    assert later.unwrap()[1] is True
    assert [r.id for r in store.queued_in_order()] == ["after", "later"]


# --- notes -----------------------------------------------------------------


def test_notes_are_appended_and_kept_through_the_lifecycle(store: Store) -> None:
    store.submit(new("a"), T0)
    store.mark_running("a", T0 + 1, None)
    first = store.add_note("a", "app: could not be checked out (disk full)")
    assert first.notes == ("app: could not be checked out (disk full)",)
    store.add_note("a", "second")
    final = store.finish("a", RunEnd(RunStatus.SUCCEEDED), T0 + 2)
    assert final.notes == ("app: could not be checked out (disk full)", "second")
    got = store.get("a")
    assert got is not None
    assert got.notes == final.notes
    with pytest.raises(RunNotFound):
        store.add_note("nope", "x")
    with pytest.raises(StoreError):
        store.add_note("a", "bad \ud800 text")


def test_a_runs_working_directory_is_kept(store: Store) -> None:
    record, _ = store.submit(new("a", cwd="/srv/repo/sub"), T0)
    assert record.cwd == "/srv/repo/sub"
    store.mark_running("a", T0 + 1, None)
    final = store.finish("a", RunEnd(RunStatus.SUCCEEDED), T0 + 2)
    assert final.cwd == "/srv/repo/sub"
    got = store.get("a")
    assert got is not None
    assert got.cwd == "/srv/repo/sub"
    assert store.submit(new("b"), T0)[0].cwd is None


# --- what runs spent -----------------------------------------------------------


def spent_run(
    store: Store,
    run_id: str,
    usage: RunUsage | None,
    at: float,
    *,
    session_id: str | None = None,
    **fields: Any,
) -> RunRecord:
    """Submit, start and finish a run ``run_id`` at ``at`` whose stream reported ``usage``."""
    store.submit(new(run_id, **fields), at)
    store.mark_running(run_id, at, None)
    end = RunEnd(RunStatus.SUCCEEDED, exit_code=0, session_id=session_id, usage=usage)
    return store.finish(run_id, end, at + 1)


def test_a_finish_keeps_what_the_run_spent_and_every_listing_reads_it(store: Store) -> None:
    record = spent_run(store, "r", SPENDING, T0)
    assert record.spend == SPENT
    assert store.get("r") == record
    assert store.list_runs() == [record]


def test_a_stream_that_said_nothing_of_spend_leaves_none(store: Store) -> None:
    """Signals alone (a retry, a duration) are no spend; a cost alone is one."""
    assert spent_run(store, "a", RunUsage(retries=2, duration=3.0), T0).spend is None
    assert spent_run(store, "b", None, T0).spend is None
    priced = spent_run(store, "c", RunUsage(cost_usd=0.5), T0)
    assert priced.spend == Spend(cost_usd=0.5)
    assert store.get("c") == priced


def test_a_requeue_clears_the_attempts_spend(store: Store) -> None:
    store.submit(new("r"), T0)
    store.mark_running("r", T0, "acct")
    end = RunEnd(UL, exit_code=1, usage=SPENDING)
    store.apply([lambda s: (s.finish("r", end, T0 + 1), s.requeue("r"))])
    requeued = store.get("r")
    assert requeued is not None
    assert requeued.status is RunStatus.QUEUED
    assert requeued.spend is None


def test_a_requeue_keeps_the_attempt_it_clears_with_its_spend(store: Store) -> None:
    store.submit(new("r"), T0)
    store.mark_running("r", T0, "acct")
    end = RunEnd(UL, exit_code=1, reason="limit", usage=SPENDING)
    store.apply([lambda s: (s.finish("r", end, T0 + 1), s.requeue("r"))])
    assert store.attempts("r") == [
        Attempt("r", 1, UL, "acct", T0, T0 + 1, 1, "limit", None, None, SPENT)
    ]
    assert store.attempts("other") == []


def finish_and_retry(store: Store, *, end: RunEnd, at: float) -> None:
    """Record an attempt's failure and re-queue it for a retry, as one operation."""
    store.finish("r", end, at + 1)
    store.requeue("r", failure="crash", retry_at=at + 5)


def test_each_retry_keeps_its_attempt_in_order_and_prune_takes_them_with_the_run(
    store: Store,
) -> None:
    store.submit(new("r"), T0)
    for number, status in enumerate((RunStatus.FAILED, RunStatus.TIMED_OUT), start=1):
        at = T0 + 10 * number
        store.mark_running("r", at, f"acct-{number}")
        end = RunEnd(status, exit_code=1, reason=f"try {number}")
        store.apply([partial(finish_and_retry, end=end, at=at)])
    record = store.mark_running("r", T0 + 40, None)
    assert record.attempts == 3
    store.finish("r", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 41)
    assert store.attempts("r") == [
        Attempt("r", 1, RunStatus.FAILED, "acct-1", T0 + 10, T0 + 11, 1, "try 1", "crash", T0 + 15),
        Attempt(
            "r", 2, RunStatus.TIMED_OUT, "acct-2", T0 + 20, T0 + 21, 1, "try 2", "crash", T0 + 25
        ),
    ]
    assert store.prune(T0 + 42) == 1
    assert store.attempts("r") == []


def codex(total_input: int, total_output: int) -> RunUsage:
    """A Codex stream's usage: the session's running totals."""
    return RunUsage(
        tokens=Tokens(input=total_input, output=total_output), turns=1, session_totals=True
    )


def tokens_of(record: RunRecord) -> Tokens | None:
    assert record.spend is not None
    return record.spend.tokens


def test_a_resumed_session_records_its_own_spend_not_the_sessions_total(store: Store) -> None:
    """Codex reports session totals: each run keeps its total less what earlier runs spent."""
    first = spent_run(store, "a", codex(100, 10), T0, session_id="s1", conversation="c")
    second = spent_run(store, "b", codex(250, 30), T0 + 5, session_id="s1", conversation="c")
    third = spent_run(store, "c", codex(260, 31), T0 + 9, session_id="s1", conversation="c")
    assert tokens_of(first) == Tokens(input=100, output=10)
    assert tokens_of(second) == Tokens(input=150, output=20)
    assert tokens_of(third) == Tokens(input=10, output=1)
    assert store.get("c") == third
    # Another session, or the same id in another conversation, is a session of its own.
    other = spent_run(store, "d", codex(40, 4), T0 + 20, session_id="s2", conversation="c")
    elsewhere = spent_run(store, "e", codex(70, 7), T0 + 21, session_id="s1", conversation="x")
    assert tokens_of(other) == Tokens(input=40, output=4)
    assert tokens_of(elsewhere) == Tokens(input=70, output=7)


def test_a_retried_attempt_in_the_same_session_records_only_what_it_spent(store: Store) -> None:
    """A retry resumes its failed attempt's session: Codex's totals count that attempt again."""
    from herdsman.runtime.store import UsageBy

    spent_run(store, "a", codex(40, 4), T0, session_id="s1", conversation="c")
    store.submit(new("r", conversation="c"), T0 + 1)
    store.mark_running("r", T0 + 1, "acct")
    failed = RunEnd(RunStatus.FAILED, exit_code=1, session_id="s1", usage=codex(100, 10))
    store.apply([partial(finish_and_retry, end=failed, at=T0 + 1)])
    [earlier] = store.attempts("r")
    assert earlier.spend is not None
    assert earlier.spend.tokens == Tokens(input=60, output=6)
    store.mark_running("r", T0 + 10, "acct")
    done = RunEnd(RunStatus.SUCCEEDED, exit_code=0, session_id="s1", usage=codex(250, 30))
    assert tokens_of(store.finish("r", done, T0 + 11)) == Tokens(input=150, output=20)
    # Every attempt summed is the session's total, counted once.
    [total] = store.usage(UsageBy.PROVIDER)
    assert (total.attempts, total.tokens) == (3, Tokens(input=250, output=30))


def test_a_retry_in_a_fresh_session_or_on_another_account_takes_nothing_off(
    store: Store,
) -> None:
    for run_id, account, session in (("x", "other", "s1"), ("y", "acct", "s2")):
        store.submit(new(run_id, conversation=run_id), T0)
        store.mark_running(run_id, T0, "acct")
        failed = RunEnd(RunStatus.FAILED, exit_code=1, session_id="s1", usage=codex(100, 10))
        store.apply([partial(finish_and_retry_run, run_id=run_id, end=failed, at=T0)])
        store.mark_running(run_id, T0 + 10, account)
        done = RunEnd(RunStatus.SUCCEEDED, exit_code=0, session_id=session, usage=codex(30, 3))
        assert tokens_of(store.finish(run_id, done, T0 + 11)) == Tokens(input=30, output=3)


def test_a_session_whose_totals_went_down_is_credited_nothing(store: Store) -> None:
    spent_run(store, "a", codex(100, 10), T0, session_id="s", conversation="c")
    fewer = spent_run(store, "b", codex(50, 20), T0 + 5, session_id="s", conversation="c")
    assert tokens_of(fewer) == Tokens(input=0, output=10)


def test_usage_totals_by_each_grouping(store: Store) -> None:
    from herdsman.runtime.store import UsageBy, UsageTotal

    spent_run(store, "a", SPENDING, T0, conversation="c1")
    store.submit(new("b", provider="codex", conversation="c1"), T0 + 10)
    store.mark_running("b", T0 + 10, "work")
    store.finish("b", RunEnd(RunStatus.FAILED, exit_code=1, usage=codex(10, 2)), T0 + 11)
    spent_run(store, "c", RunUsage(cost_usd=0.5, turns=1), T0 + 20, workspace="w2")
    spent_run(store, "d", None, T0 + 30)  # no spend: not counted anywhere
    t = SPENDING.tokens
    assert t is not None
    by_provider = store.usage(UsageBy.PROVIDER)
    assert by_provider == [
        UsageTotal("claude", None, 2, 2, t, 0.0123 + 0.5, 2, 4, 7.25),
        UsageTotal("codex", None, 1, 1, Tokens(input=10, output=2), None, 0, 1, None),
    ]
    assert [(u.group, u.runs) for u in store.usage(UsageBy.ACCOUNT)] == [(None, 2), ("work", 1)]
    assert [(u.workspace, u.group, u.runs) for u in store.usage(UsageBy.CONVERSATION)] == [
        ("default", "c1", 2),
        ("w2", None, 1),
    ]
    assert store.usage(UsageBy.MODEL) == [
        UsageTotal("claude-haiku", None, 1, 1, Tokens(input=20, output=6), 0.0003, 1, None, None),
        UsageTotal(
            "claude-sonnet-\u00e9", None, 1, 1, Tokens(100, 4096, 512, 50), 0.012, 1, None, None
        ),
    ]
    # Since: runs that finished at or after it.
    assert [(u.group, u.runs) for u in store.usage(UsageBy.PROVIDER, T0 + 11)] == [
        ("claude", 1),
        ("codex", 1),
    ]
    assert store.usage(UsageBy.PROVIDER, T0 + 100) == []
    with pytest.raises(StoreError):
        store.usage(UsageBy.PROVIDER, float("nan"))


def test_usage_counts_every_attempt_of_a_retried_run_under_its_own_account(store: Store) -> None:
    """A run re-queued after a usage limit, then retried, spent on all three attempts."""
    from herdsman.runtime.store import UsageBy, UsageTotal

    store.submit(new("r", conversation="c"), T0)
    store.mark_running("r", T0, "first")
    limited = RunEnd(UL, exit_code=1, usage=SPENDING)
    store.apply([lambda s: (s.finish("r", limited, T0 + 1), s.requeue("r"))])
    store.mark_running("r", T0 + 10, "second")
    failed = RunEnd(RunStatus.FAILED, exit_code=1, usage=RunUsage(cost_usd=0.25, turns=1))
    store.apply([partial(finish_and_retry, end=failed, at=T0 + 10)])
    store.mark_running("r", T0 + 20, "second")
    store.finish("r", RunEnd(RunStatus.SUCCEEDED, exit_code=0, usage=codex(10, 2)), T0 + 21)
    # A retry still waiting for its next attempt: its failed one counts already.
    store.submit(new("w"), T0 + 30)
    store.mark_running("w", T0 + 30, "first")
    store.apply([lambda s: finish_and_retry_run(s, "w", end=failed, at=T0 + 30)])
    t = SPENDING.tokens
    assert t is not None
    assert store.usage(UsageBy.PROVIDER) == [
        UsageTotal(
            "claude", None, 2, 4, t + Tokens(input=10, output=2), 0.0123 + 0.25 + 0.25, 3, 6, 7.25
        )
    ]
    assert [(u.group, u.runs, u.attempts, u.cost_usd) for u in store.usage(UsageBy.ACCOUNT)] == [
        ("first", 2, 2, 0.0123 + 0.25),
        ("second", 1, 2, 0.25),
    ]
    assert [(u.group, u.runs, u.attempts) for u in store.usage(UsageBy.CONVERSATION)] == [
        (None, 1, 1),
        ("c", 1, 3),
    ]
    assert [(u.group, u.runs, u.attempts) for u in store.usage(UsageBy.MODEL)] == [
        ("claude-haiku", 1, 1),
        ("claude-sonnet-\u00e9", 1, 1),
    ]
    # Since: each attempt by its own end.
    assert [(u.runs, u.attempts, u.cost_usd) for u in store.usage(UsageBy.PROVIDER, T0 + 11)] == [
        (2, 3, 0.5)
    ]
    assert [(u.runs, u.attempts, u.tokens) for u in store.usage(UsageBy.PROVIDER, T0 + 21)] == [
        (2, 2, Tokens(input=10, output=2))
    ]
    # Prune takes the attempts with their run.
    assert store.prune(T0 + 25) == 1
    assert [(u.runs, u.attempts) for u in store.usage(UsageBy.PROVIDER)] == [(1, 1)]


def finish_and_retry_run(store: Store, run_id: str, *, end: RunEnd, at: float) -> None:
    """Record ``run_id``'s failed attempt and re-queue it for a retry, as one operation."""
    store.finish(run_id, end, at + 1)
    store.requeue(run_id, failure="crash", retry_at=at + 5)
