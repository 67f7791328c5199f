"""Accounts fleet-wide in the ledger: usage by member, rests and budgets held by the claim.

Against a real server. The examples pin each rule. Two property tests: one
races members claiming on one budgeted account and checks that no window
ever holds more starts than the budget; the other interleaves claims, ends,
rests and time, and checks that each claim decides as the account core
would, told every run of the fleet.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

import attrs
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_fleet_properties import members

from herdsman.core.accounts import AccountBook, AccountSpec
from herdsman.runtime.store import AccountUse, NewRun, RunEnd, RunRecord, RunStatus
from herdsman.runtime.store.fleet import AccountBudget, ClaimRules, FleetStore, Refusal

T0 = 1_700_000_000.0
HOUR = 3600.0


def submit(store: FleetStore, run_id: str, at: float = T0) -> None:
    store.submit(NewRun(id=run_id, provider="claude", prompt="p"), at)


def claim(store: FleetStore, run_id: str, at: float, rules: ClaimRules) -> Refusal | None:
    result = store.claim_many([(run_id, "work")], at, rules)
    return dict(result.refused).get(run_id)


def budget(count: int, unit: Literal["runs", "run_minutes"] = "runs") -> ClaimRules:
    return ClaimRules(account_budgets={("claude", "work"): AccountBudget(HOUR, count, unit)})


def test_usage_by_member_tells_this_members_runs_from_the_others(postgres_server: str) -> None:
    with members(postgres_server, 3) as (a, b, c):
        for run_id in ("mine", "theirs", "lost", "unspawned"):
            submit(a, run_id)
        assert a.claim_many([("mine", "work")], T0 + 1).claimed
        assert b.claim_many([("theirs", "work"), ("unspawned", "work")], T0 + 2).claimed
        b.finish("theirs", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 62)
        b.finish("unspawned", RunEnd(RunStatus.CANCELLED), T0 + 3)  # never got a process
        c.claim_many([("lost", "work")], T0 + 4)
        c.leave()  # its run is lost at the next expiry
        assert [r.id for r in a.expire_lapsed(T0 + 500)] == ["lost"]
        usage = a.account_usage_by_member(T0)
        assert usage.mine == [AccountUse("claude", "work", T0 + 1, None)]
        assert usage.elsewhere == [
            AccountUse("claude", "work", T0 + 2, T0 + 62),
            # Lost: a start, charged no run-minutes (ends when it started).
            AccountUse("claude", "work", T0 + 4, T0 + 4),
        ]
        # What b reads is the same runs, the other way round.
        assert [u.started_at for u in b.account_usage_by_member(T0).mine] == [T0 + 2]


def test_no_run_is_claimed_on_an_account_resting_in_the_ledger(postgres_server: str) -> None:
    with members(postgres_server, 2) as (a, b):
        submit(a, "r1")
        b.set_account_limit("claude", "work", T0 + 600, "usage limit")
        assert claim(a, "r1", T0 + 1, ClaimRules()) is Refusal.ACCOUNT_RESTING
        # Another account, and the same account once the rest is over, are fine.
        assert [r.id for r in a.claim_many([("r1", "other")], T0 + 1).claimed] == ["r1"]
        submit(a, "r2")
        assert claim(a, "r2", T0 + 600, ClaimRules()) is None


def test_a_rest_ended_through_any_member_frees_the_account_at_once(postgres_server: str) -> None:
    with members(postgres_server, 2) as (a, b):
        submit(a, "r1")
        a.set_account_limit("claude", None, T0 + 600, "usage limit")  # the ambient one
        assert dict(a.claim_many([("r1", None)], T0 + 1).refused) == {"r1": Refusal.ACCOUNT_RESTING}
        b.clear_account_limit("claude", None)
        assert [r.id for r in a.claim_many([("r1", None)], T0 + 2).claimed] == ["r1"]


def test_a_runs_budget_counts_every_members_starts_in_the_window(postgres_server: str) -> None:
    with members(postgres_server, 2) as (a, b):
        for n in range(6):
            submit(a, f"r{n}")
        rules = budget(2)
        assert claim(a, "r0", T0, rules) is None
        # In one claim, the second item sees the first.
        result = b.claim_many([("r1", "work"), ("r2", "work")], T0 + 10, rules)
        assert [r.id for r in result.claimed] == ["r1"]
        assert result.refused == [("r2", Refusal.ACCOUNT_BUDGET)]
        # Finished or not, started in the window counts; another account does not.
        a.finish("r0", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 20)
        assert claim(a, "r2", T0 + 30, rules) is Refusal.ACCOUNT_BUDGET
        assert a.claim_many([("r2", "other")], T0 + 30, rules).refused == []
        # A start that never got a process gives its place back.
        b.finish("r1", RunEnd(RunStatus.CANCELLED), T0 + 40)
        assert claim(b, "r3", T0 + 41, rules) is None
        # r0 leaves the window an hour after its start (as in the account core).
        assert claim(a, "r4", T0 + HOUR - 1, rules) is Refusal.ACCOUNT_BUDGET
        assert claim(a, "r4", T0 + HOUR, rules) is None


def test_a_run_minutes_budget_counts_finished_and_running_minutes(postgres_server: str) -> None:
    with members(postgres_server, 2) as (a, b):
        for n in range(4):
            submit(a, f"r{n}")
        rules = budget(10, "run_minutes")
        assert claim(a, "r0", T0, rules) is None
        a.finish("r0", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 240)  # 4 minutes
        assert claim(b, "r1", T0 + 240, rules) is None  # running from here
        # 4 + 5.9 minutes: room left; 4 + 6: spent.
        assert claim(a, "r2", T0 + 240 + 354, rules) is None
        a.finish("r2", RunEnd(RunStatus.CANCELLED), T0 + 600)  # unspawned: no minutes
        assert claim(a, "r3", T0 + 240 + 360, rules) is Refusal.ACCOUNT_BUDGET


@pytest.mark.parametrize("value", [0, -1, float("nan")])
def test_a_budget_must_be_positive(value: float) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        AccountBudget(value, 1)
    with pytest.raises(ValueError, match="must be > 0"):
        AccountBudget(HOUR, value)


BUDGET, WINDOW = 3, 100.0
RULES = ClaimRules(account_budgets={("claude", "work"): AccountBudget(WINDOW, BUDGET)})

steps = st.lists(
    st.tuples(
        st.integers(0, 30),  # seconds that pass
        st.lists(st.integers(0, 3), min_size=2, max_size=4),  # claims per member
        st.sampled_from(["finish", "cancel", "none"]),  # what becomes of the oldest running
    ),
    min_size=3,
    max_size=14,
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=steps)
def test_members_racing_for_a_budget_never_start_more_than_it_in_a_window(
    postgres_server: str, steps: list[tuple[int, list[int], str]]
) -> None:
    """Members claim at once, in threads, on one account with a runs budget.

    After each round: no window of ``WINDOW`` seconds holds more than
    ``BUDGET`` spawned starts, and no run was refused while the budget had
    room (it is the only rule in play). Between rounds, time passes, the
    oldest running run finishes or turns out never to have been spawned
    (giving its start back), and what is still queued is withdrawn.
    """
    with members(postgres_server, 3) as stores:
        now, made = T0, 0
        for elapsed, wants, fate in steps:
            now += elapsed
            ids = []
            for want in wants:
                ids.append([f"r{made + i}" for i in range(want)])
                made += want
            for batch in ids:
                for run_id in batch:
                    submit(stores[0], run_id, now)
            race(stores, ids, now)
            records = stores[0].list_runs(limit=1000)
            running = sorted(
                (r for r in records if r.status is RunStatus.RUNNING),
                key=lambda r: r.started_at or 0,
            )
            check_windows(records)
            # The budget is the only rule here: a claim refused must have
            # found it spent, so no run is left queued while room remained.
            counted = spawned_starts(records)
            in_window = [t for t in counted if t > now - WINDOW]
            queued = [r for r in records if r.status is RunStatus.QUEUED]
            assert not queued or len(in_window) >= BUDGET, (in_window, queued)
            if running and fate != "none":
                oldest = running[0]
                holder = next(s for s in stores if s.held_by(oldest.id) == s.member_id)
                if fate == "finish":
                    holder.finish(oldest.id, RunEnd(RunStatus.SUCCEEDED, exit_code=0), now)
                else:  # never got a process: its start is given back
                    holder.finish(oldest.id, RunEnd(RunStatus.CANCELLED), now)
            for record in queued:  # withdrawn: each round starts afresh
                stores[0].cancel_queued(record.id, now, "test")


def spawned_starts(records: list[RunRecord]) -> list[float]:
    return sorted(
        r.started_at
        for r in records
        if r.started_at is not None and (r.exit_code is not None or r.status is RunStatus.RUNNING)
    )


def check_windows(records: list[RunRecord]) -> None:
    starts = spawned_starts(records)
    for n, first in enumerate(starts):
        inside = [t for t in starts[n:] if t < first + WINDOW]
        assert len(inside) <= BUDGET, f"{len(inside)} starts within {WINDOW}s from {first}"


def race(stores: list[FleetStore], batches: list[list[str]], now: float) -> None:
    """Member ``n % len(stores)`` claims ``batches[n]``, all at once, in threads."""
    barrier = threading.Barrier(len(batches))
    errors: list[BaseException] = []

    def claim_batch(n: int, batch: list[str]) -> None:
        barrier.wait()
        try:
            stores[n % len(stores)].claim_many([(i, "work") for i in batch], now, RULES)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim_batch, args=pair) for pair in enumerate(batches)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


MODEL_WINDOW = 100.0
SPECS = [
    AccountSpec("a", window=MODEL_WINDOW, budget=2),
    AccountSpec("b", window=MODEL_WINDOW, budget=1, unit="run_minutes"),
    AccountSpec("c"),
]
MODEL_RULES = ClaimRules(
    account_budgets={
        ("claude", "a"): AccountBudget(MODEL_WINDOW, 2),
        ("claude", "b"): AccountBudget(MODEL_WINDOW, 1, "run_minutes"),
    }
)
ACCOUNT = st.sampled_from(["a", "b", "c"])
model_steps = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.integers(0, 2), ACCOUNT),
        st.tuples(st.just("claim"), st.integers(0, 2), ACCOUNT),
        st.tuples(st.just("end"), st.integers(0, 30), st.booleans()),
        st.tuples(st.just("rest"), st.integers(0, 2), ACCOUNT, st.sampled_from([1, 50, 100])),
        st.tuples(st.just("end_rest"), st.integers(0, 2), ACCOUNT),
        # Steps that land on the window's and the run-minute budget's edges.
        st.tuples(st.just("tick"), st.sampled_from([1, 10, 30, 50, 60, 100])),
    ),
    min_size=4,
    max_size=30,
)


@attrs.define
class Run:
    account: str
    member: int
    started_at: float
    finished_at: float | None = None
    spawned: bool = True


def expected_refusal(
    runs: dict[str, Run], rests: dict[str, float], account: str, now: float
) -> Refusal | None:
    """What the account core, told every run of the fleet, says of ``account`` at ``now``."""
    book = AccountBook({"claude": SPECS})
    for name, until in rests.items():
        book.rest("claude", name, until, "limit")
    for run_id, run in sorted(runs.items(), key=lambda item: item[1].started_at):
        if run.finished_at is None:
            book.start(run_id, "claude", run.account, run.started_at)
        elif run.spawned:
            book.restore_usage("claude", run.account, run.started_at, run.finished_at)
    [status] = [s for s in book.statuses(now) if s.account == account]
    if status.reason is None:
        return None
    if status.reason == "usage limit reached":
        return Refusal.ACCOUNT_RESTING
    assert status.reason.startswith("budget of"), status.reason
    return Refusal.ACCOUNT_BUDGET


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=model_steps)
# The window's edge: two starts leave it exactly one window later.
@example(steps=[("claim", 0, "a"), ("claim", 1, "a"), ("tick", 100), ("claim", 2, "a")])
# A run-minute budget reached exactly, by a run that ended, then freed as its end leaves.
@example(
    steps=[
        ("claim", 0, "b"),
        ("tick", 60),
        ("end", 0, True),
        ("claim", 1, "b"),
        ("tick", 100),
        ("claim", 1, "b"),
    ]
)
# A rest ending exactly at the claim, and one ended by another member.
@example(
    steps=[
        ("rest", 0, "c", 50),
        ("claim", 1, "c"),
        ("tick", 50),
        ("claim", 1, "c"),
        ("rest", 2, "a", 100),
        ("claim", 0, "a"),
        ("end_rest", 1, "a"),
        ("claim", 0, "a"),
    ]
)
def test_every_claim_decides_on_rests_and_budgets_as_the_account_core_would(
    postgres_server: str, steps: list[tuple[Any, ...]]
) -> None:
    """Members claim, end runs (spawned or not), rest and end rests, as time passes.

    Each claim's decision on its account equals the account core's, given
    every run of the fleet and the rests in the ledger: the ledger counts
    budgets and windows exactly as one supervisor does on its own.
    """
    with members(postgres_server, 3) as stores:
        now, runs, rests = T0, dict[str, Run](), dict[str, float]()
        for step, (kind, *args) in enumerate(steps):
            if kind == "tick":
                now += args[0]
            elif kind == "rest":
                who, account, seconds = args
                stores[who].set_account_limit("claude", account, now + seconds, "limit")
                rests[account] = now + seconds
            elif kind == "end_rest":
                who, account = args
                stores[who].clear_account_limit("claude", account)
                rests.pop(account, None)
            elif kind == "end":
                running = [i for i, run in runs.items() if run.finished_at is None]
                if running:
                    run_id = running[args[0] % len(running)]
                    run, spawned = runs[run_id], args[1]
                    exit_code = 0 if spawned else None
                    stores[run.member].finish(
                        run_id,
                        RunEnd(
                            RunStatus.SUCCEEDED if spawned else RunStatus.CANCELLED,
                            exit_code=exit_code,
                        ),
                        now,
                    )
                    run.finished_at, run.spawned = now, spawned
            else:
                who, account = args
                run_id = f"r{step}"
                submit(stores[who], run_id, now)
                want = expected_refusal(runs, rests, account, now)
                result = stores[who].claim_many([(run_id, account)], now, MODEL_RULES)
                assert dict(result.refused).get(run_id) == want, (run_id, account, now)
                if want is None:
                    runs[run_id] = Run(account, who, now)
                else:
                    stores[who].cancel_queued(run_id, now, "test")
