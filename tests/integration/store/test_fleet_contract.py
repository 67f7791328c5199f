"""The fleet ledger's contract, run against the PostgreSQL FleetStore and the simulator's fake.

Every case runs twice: on members of a real PostgreSQL ledger, and on members
of ``herdsman.sim.fleet_store.SimFleet``, which the fuzzer's fleet runs on. So
the fake answers every call the supervisor and FleetMember make as the real
one does: claims with their rules and refusals, polls with cursors, leases
renewed, lapsed and expired with the margin, ``submit_unless_busy``, cancel
requests, re-queues, usage by member, live conversations. A differential
property test then drives both with the same drawn programs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from fleet_kinds import FleetUnderTest, PostgresFleet, SimulatedFleet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fleet_store import run

from herdsman.runtime.fleet_ports import FleetLedger
from herdsman.runtime.store import AccountUse, RunEnd, RunNotFound, RunStatus, StoreConflict
from herdsman.runtime.store.errors import LeaseExpired, StoreError
from herdsman.runtime.store.fleet import AccountBudget, ClaimRules, Refusal, UsageByMember
from herdsman.runtime.store.records import LOST_ON_RESTART
from postgres_support import fresh_schema

T0 = 1_700_000_000.0
HOUR = 3600.0


@pytest.fixture(params=["postgres", "sim"])
def ledger(request: pytest.FixtureRequest) -> Iterator[FleetUnderTest]:
    """A fresh fleet ledger of each kind."""
    if request.param == "sim":
        fleet: FleetUnderTest = SimulatedFleet()
        try:
            yield fleet
        finally:
            fleet.close()
        return
    url = request.getfixturevalue("postgres_url")
    fleet = PostgresFleet(url)
    try:
        yield fleet
    finally:
        fleet.close()


def ids(records: Any) -> list[str]:
    return [record.id for record in records]


def status(store: FleetLedger, run_id: str) -> RunStatus:
    record = store.get(run_id)
    assert record is not None
    return record.status


# --- claims ----------------------------------------------------------------------


def test_a_run_is_claimed_once_and_held_by_its_claimant(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1", "c1"), T0)
    first = b.claim_many([("r1", "acct")], T0 + 1)
    second = a.claim_many([("r1", "acct")], T0 + 2)
    assert ids(first.claimed) == ["r1"]
    assert first.claimed[0].account == "acct"
    assert first.claimed[0].started_at == T0 + 1
    assert second.claimed == []
    assert second.refused == [("r1", Refusal.GONE)]
    assert a.held_by("r1") == b.member_id
    assert ids(a.running_elsewhere()) == ["r1"]
    assert b.running_elsewhere() == []
    record = a.get("r1")
    assert record is not None
    assert (record.status, record.attempts) == (RunStatus.RUNNING, 1)


def test_only_the_holder_records_how_a_running_run_ended(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1", "c1"), T0)
    a.claim_many([("r1", None)], T0)
    with pytest.raises(StoreConflict, match="on this supervisor"):
        b.finish("r1", RunEnd(RunStatus.FAILED, exit_code=1), T0 + 1)
    final = a.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 2)
    assert final.status is RunStatus.SUCCEEDED
    assert a.held_by("r1") is None
    with pytest.raises(RunNotFound):
        a.finish("nope", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 2)


def test_a_members_finish_keeps_the_spend_every_member_reads(ledger: FleetUnderTest) -> None:
    from herdsman.runtime.runner.run_usage import ModelUsage, RunUsage, Tokens
    from herdsman.runtime.store import Spend, UsageBy

    usage = RunUsage(
        tokens=Tokens(input=9, output=4),
        cost_usd=0.02,
        models=(ModelUsage("m", Tokens(input=9, output=4), 0.02),),
        turns=2,
        api_time=1.0,
    )
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1", "c1"), T0)
    a.claim_many([("r1", "acct")], T0)
    final = a.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0, usage=usage), T0 + 2)
    assert final.spend == Spend(usage.tokens, 0.02, usage.models, 2, 1.0)
    assert b.get("r1") == final
    [total] = b.usage(UsageBy.ACCOUNT)
    assert (total.group, total.runs, total.tokens, total.cost_usd) == (
        "acct",
        1,
        usage.tokens,
        0.02,
    )
    # A session's running totals (Codex): the next run of it, on another member, its own.
    codex = RunUsage(tokens=Tokens(input=30, output=10), session_totals=True)
    b.submit(run("r2", "c1"), T0 + 3)
    b.claim_many([("r2", "acct")], T0 + 3)
    end = RunEnd(RunStatus.SUCCEEDED, exit_code=0, session_id="s", usage=codex)
    second = b.finish("r2", end, T0 + 4)
    assert second.spend is not None
    assert second.spend.tokens == Tokens(input=30, output=10)  # r1 named no session "s"
    b.submit(run("r3", "c1"), T0 + 5)
    b.claim_many([("r3", "acct")], T0 + 5)
    more = RunUsage(tokens=Tokens(input=50, output=12), session_totals=True)
    third = b.finish("r3", attrs.evolve(end, usage=more), T0 + 6)
    assert third.spend is not None
    assert third.spend.tokens == Tokens(input=20, output=2)


def test_a_retry_in_its_failed_attempt_s_session_records_only_what_it_spent(
    ledger: FleetUnderTest,
) -> None:
    """A Codex retry resumes its session, whose totals count the failed attempt again.

    The attempt kept at the re-queue is taken off, as the single-supervisor
    stores take it off, whichever member runs the retry.
    """
    from herdsman.runtime.runner.run_usage import RunUsage, Tokens

    def codex(total_input: int, total_output: int) -> RunUsage:
        return RunUsage(tokens=Tokens(input=total_input, output=total_output), session_totals=True)

    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1", "c1"), T0)
    a.claim_many([("r1", "acct")], T0)
    failed = RunEnd(RunStatus.FAILED, exit_code=1, session_id="s1", usage=codex(100, 10))
    a.finish("r1", failed, T0 + 1)
    a.requeue("r1", failure="overloaded", retry_at=T0 + 2)
    [earlier] = b.attempts("r1")
    assert earlier.spend is not None
    assert earlier.spend.tokens == Tokens(input=100, output=10)
    assert ids(b.claim_many([("r1", "acct")], T0 + 3).claimed) == ["r1"]
    done = RunEnd(RunStatus.SUCCEEDED, exit_code=0, session_id="s1", usage=codex(250, 30))
    final = b.finish("r1", done, T0 + 4)
    assert final.spend is not None
    assert final.spend.tokens == Tokens(input=150, output=20)
    # Retried on another account, or in a fresh session: nothing is taken off.
    for run_id, account, session in (("r2", "other", "s2"), ("r3", "acct", "s4")):
        a.submit(run(run_id, run_id), T0 + 5)
        a.claim_many([(run_id, "acct")], T0 + 5)
        a.finish(run_id, attrs.evolve(failed, session_id="s2"), T0 + 6)
        a.requeue(run_id, failure="overloaded", retry_at=T0 + 6)
        a.claim_many([(run_id, account)], T0 + 7)
        again = a.finish(run_id, attrs.evolve(done, session_id=session, usage=codex(30, 3)), T0 + 8)
        assert again.spend is not None
        assert again.spend.tokens == Tokens(input=30, output=3), run_id


def test_a_run_on_a_lane_running_elsewhere_is_refused_until_it_ends(
    ledger: FleetUnderTest,
) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1", "c1"), T0)
    a.submit(run("r2", "c1"), T0)
    a.submit(run("other", "c2"), T0)
    assert ids(a.claim_many([("r1", None)], T0).claimed) == ["r1"]
    refused = b.claim_many([("r2", None), ("other", None)], T0)
    assert refused.refused == [("r2", Refusal.LANE_BUSY)]
    assert ids(refused.claimed) == ["other"]
    a.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 1)
    assert ids(b.claim_many([("r2", None)], T0 + 2).claimed) == ["r2"]


def test_a_run_behind_an_earlier_queued_run_on_its_lane_waits(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1", "c1", agent="x"), T0)
    b.submit(run("r2", "c1"), T0)
    b.submit(run("r3", "c9", agent="x"), T0)
    b.submit(run("r4", "c1", workspace="elsewhere"), T0)
    result = b.claim_many([("r2", None), ("r3", None), ("r4", None)], T0)
    assert result.refused == [("r2", Refusal.EARLIER_QUEUED), ("r3", Refusal.EARLIER_QUEUED)]
    assert ids(result.claimed) == ["r4"]
    loose = b.claim_many([("r3", None)], T0, ClaimRules(agent_exclusive=False))
    assert ids(loose.claimed) == ["r3"]


def test_items_of_one_claim_see_the_claims_before_them(ledger: FleetUnderTest) -> None:
    a = ledger.member("a")
    a.submit(run("r1", "c1", agent="x"), T0)
    a.submit(run("r2", "c2", agent="x"), T0)
    result = a.claim_many([("r1", None), ("r2", None)], T0, ClaimRules(agent_exclusive=True))
    assert ids(result.claimed) == ["r1"]
    assert result.refused == [("r2", Refusal.LANE_BUSY)]


def test_fleet_wide_caps_per_provider_and_per_account(ledger: FleetUnderTest) -> None:
    rules = ClaimRules(provider_caps={"claude": 2}, account_caps={("codex", "team"): 1})
    a, b = ledger.member("a"), ledger.member("b")
    for n in range(3):
        a.submit(run(f"c{n}"), T0)
        a.submit(run(f"x{n}", provider="codex"), T0)
    assert len(a.claim_many([("c0", None)], T0, rules).claimed) == 1
    assert b.claim_many([("c1", None), ("c2", None)], T0, rules).refused == [
        ("c2", Refusal.PROVIDER_CAP)
    ]
    result = b.claim_many([("x0", "team"), ("x1", "team"), ("x2", "solo")], T0, rules)
    assert result.refused == [("x1", Refusal.ACCOUNT_CAP)]
    assert ids(result.claimed) == ["x0", "x2"]
    a.finish("c0", RunEnd(RunStatus.FAILED, exit_code=1), T0 + 1)
    assert ids(b.claim_many([("c2", None)], T0 + 1, rules).claimed) == ["c2"]


def test_a_claim_refuses_an_unknown_id_as_gone_and_a_member_claims_only(
    ledger: FleetUnderTest,
) -> None:
    a = ledger.member("a")
    a.submit(run("r1"), T0)
    assert a.claim_many([("ghost", None), ("r1", None)], T0).refused == [("ghost", Refusal.GONE)]
    a.submit(run("r2"), T0)
    with pytest.raises(StoreError, match="claim_many"):
        a.mark_running_many([("r2", None)], T0)
    with pytest.raises(StoreError, match="expire_lapsed"):
        a.recover(T0)
    assert status(a, "r2") is RunStatus.QUEUED


def test_a_claim_with_a_clock_stamps_its_starts_from_it(ledger: FleetUnderTest) -> None:
    a = ledger.member("a")
    a.submit(run("r1"), T0)
    claimed = a.claim_many([("r1", None)], T0, clock=lambda: T0 + 5).claimed
    assert [record.started_at for record in claimed] == [T0 + 5]


# --- accounts --------------------------------------------------------------------


def test_no_run_is_claimed_on_an_account_resting_in_the_ledger(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1"), T0)
    b.set_account_limit("claude", "work", T0 + 600, "usage limit")
    assert a.claim_many([("r1", "work")], T0 + 1).refused == [("r1", Refusal.ACCOUNT_RESTING)]
    assert ids(a.claim_many([("r1", "other")], T0 + 1).claimed) == ["r1"]
    a.submit(run("r2"), T0)
    a.set_account_limit("claude", None, T0 + 600, "usage limit")  # the ambient one
    assert a.claim_many([("r2", None)], T0 + 1).refused == [("r2", Refusal.ACCOUNT_RESTING)]
    b.clear_account_limit("claude", None)
    assert ids(a.claim_many([("r2", None)], T0 + 1).claimed) == ["r2"]


@pytest.mark.parametrize("unit", ["runs", "run_minutes"])
def test_an_account_s_budget_is_spent_by_every_member_s_runs(
    ledger: FleetUnderTest, unit: str
) -> None:
    budget = 2 if unit == "runs" else 3  # two runs, or three minutes
    rules = ClaimRules(
        account_budgets={("claude", "work"): AccountBudget(HOUR, budget, unit)}  # type: ignore[arg-type]
    )
    a, b = ledger.member("a"), ledger.member("b")
    for n in range(4):
        a.submit(run(f"r{n}"), T0)
    assert ids(a.claim_many([("r0", "work")], T0, rules).claimed) == ["r0"]
    a.finish("r0", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 90)
    assert ids(b.claim_many([("r1", "work")], T0 + 100, rules).claimed) == ["r1"]
    # Runs: two started. Minutes: 1.5 ended, and r1's 1.5 so far at T0 + 190.
    assert b.claim_many([("r2", "work")], T0 + 190, rules).refused == [
        ("r2", Refusal.ACCOUNT_BUDGET)
    ]
    # A run that never got a process spends nothing; the window moves on.
    b.finish("r1", RunEnd(RunStatus.CANCELLED), T0 + 191)
    later = T0 + HOUR + 100
    assert ids(a.claim_many([("r2", "work"), ("r3", "work")], later, rules).claimed) == [
        "r2",
        "r3",
    ]


def test_a_budget_counts_a_retried_runs_earlier_attempts_fleet_wide(ledger: FleetUnderTest) -> None:
    def rules(budget: float, unit: str) -> ClaimRules:
        return ClaimRules(
            account_budgets={("claude", "work"): AccountBudget(HOUR, budget, unit)}  # type: ignore[arg-type]
        )

    a, b = ledger.member("a"), ledger.member("b")
    for n in range(4):
        a.submit(run(f"r{n}"), T0)
    runs, minutes = rules(2, "runs"), rules(5, "run_minutes")
    # r0's first attempt ran 4 minutes on work through a, then was retried.
    assert a.claim_many([("r0", "work")], T0, runs).claimed
    a.finish("r0", RunEnd(RunStatus.FAILED, exit_code=1), T0 + 240)
    a.requeue("r0", failure="overloaded", retry_at=T0 + 241)
    # Its retry on another account leaves work's earlier attempt counted.
    assert b.claim_many([("r0", "other")], T0 + 250, runs).claimed
    assert b.claim_many([("r1", "work")], T0 + 260, runs).claimed  # a start, the second
    assert b.claim_many([("r2", "work")], T0 + 270, runs).refused == [
        ("r2", Refusal.ACCOUNT_BUDGET)
    ]
    # 4 minutes earlier plus r1's 0.9 running: room; at 1 more minute, spent.
    assert b.claim_many([("r2", "work")], T0 + 260 + 54, minutes).claimed
    b.finish("r2", RunEnd(RunStatus.CANCELLED), T0 + 260 + 55)  # no process: no minutes
    assert b.claim_many([("r3", "work")], T0 + 260 + 60, minutes).refused == [
        ("r3", Refusal.ACCOUNT_BUDGET)
    ]


@pytest.mark.parametrize("unit", ["tokens", "usd"])
def test_a_budget_in_tokens_or_dollars_counts_running_runs_at_the_mean_of_ended_ones(
    ledger: FleetUnderTest, unit: str
) -> None:
    from herdsman.runtime.runner.run_usage import RunUsage, Tokens

    # 1000 tokens counted (input 600, cache writes 300, output 100; the
    # 5000 cache reads are not), and $0.50, a run.
    spent = RunUsage(
        tokens=Tokens(input=600, cache_read=5000, cache_write=300, output=100), cost_usd=0.5
    )
    budget = 2500 if unit == "tokens" else 1.25
    rules = ClaimRules(
        account_budgets={("claude", "work"): AccountBudget(HOUR, budget, unit)}  # type: ignore[arg-type]
    )
    a, b = ledger.member("a"), ledger.member("b")
    for n in range(5):
        a.submit(run(f"r{n}"), T0)
    # Nothing has ended: a running run counts nothing, so both start.
    assert ids(a.claim_many([("r0", "work"), ("r1", "work")], T0, rules).claimed) == ["r0", "r1"]
    a.finish("r0", RunEnd(RunStatus.SUCCEEDED, exit_code=0, usage=spent), T0 + 10)
    # r0 spent 1000 ($0.50) and r1 runs, counted at that mean: 2000 ($1.00) < budget.
    assert ids(b.claim_many([("r2", "work")], T0 + 20, rules).claimed) == ["r2"]
    # Now 1000 + two running at 1000 each: 3000 ($1.50), over.
    assert b.claim_many([("r3", "work")], T0 + 30, rules).refused == [
        ("r3", Refusal.ACCOUNT_BUDGET)
    ]
    # An end without figures counts nothing and leaves the mean as it was:
    # 1000 + r2 running at 1000 = 2000 ($1.00), under.
    a.finish("r1", RunEnd(RunStatus.FAILED, exit_code=1), T0 + 40)
    assert ids(b.claim_many([("r3", "work")], T0 + 50, rules).claimed) == ["r3"]
    usage = a.account_usage_by_member(T0)
    assert [(use.tokens, use.usd) for use in usage.mine] == [(1000, 0.5), (None, None)]
    assert [(use.tokens, use.usd) for use in usage.elsewhere] == [(None, None), (None, None)]
    # The window moves on: what ended leaves it, and running runs count nothing again.
    later = T0 + HOUR + 100
    assert ids(a.claim_many([("r4", "work")], later, rules).claimed) == ["r4"]


def test_usage_by_member_tells_this_member_s_runs_from_the_others(
    ledger: FleetUnderTest,
) -> None:
    a, b, c = ledger.member("a"), ledger.member("b"), ledger.member("c")
    for run_id in ("mine", "theirs", "lost", "unspawned"):
        a.submit(run(run_id), T0)
    assert a.claim_many([("mine", "work")], T0 + 1).claimed
    assert b.claim_many([("theirs", "work"), ("unspawned", "work")], T0 + 2).claimed
    b.finish("theirs", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 62)
    b.finish("unspawned", RunEnd(RunStatus.CANCELLED), T0 + 3)
    c.claim_many([("lost", "work")], T0 + 4)
    c.leave()
    assert ids(a.expire_lapsed(T0 + 500)) == ["lost"]
    usage = a.account_usage_by_member(T0)
    assert usage.mine == [AccountUse("claude", "work", T0 + 1, None)]
    assert usage.elsewhere == [
        AccountUse("claude", "work", T0 + 2, T0 + 62),
        AccountUse("claude", "work", T0 + 4, T0 + 4),
    ]
    assert [use.started_at for use in b.account_usage_by_member(T0).mine] == [T0 + 2]
    assert a.account_usage(T0) == [*usage.mine, *usage.elsewhere]


def test_usage_by_member_puts_each_earlier_attempt_with_the_member_that_ran_it(
    ledger: FleetUnderTest,
) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r"), T0)
    # Attempt 1 on a, attempt 2 on b, each failed and retried; attempt 3 runs on a.
    for member, at in ((a, T0 + 1), (b, T0 + 5)):
        assert member.claim_many([("r", "work")], at).claimed
        member.finish("r", RunEnd(RunStatus.FAILED, exit_code=1), at + 2)
        member.requeue("r", failure="server_error", retry_at=at + 3)
    assert a.claim_many([("r", "other")], T0 + 10).claimed
    assert [attempt.held_by for attempt in a.attempts("r")] == [a.member_id, b.member_id]
    first, second = (
        AccountUse("claude", "work", T0 + 1, T0 + 3),
        AccountUse("claude", "work", T0 + 5, T0 + 7),
    )
    third = AccountUse("claude", "other", T0 + 10, None)
    assert a.account_usage_by_member(T0) == UsageByMember([first, third], [second])
    assert b.account_usage_by_member(T0) == UsageByMember([second], [first, third])
    # A member that joins later (a restarted supervisor is a new member) ran none of them.
    assert ledger.member("c").account_usage_by_member(T0) == UsageByMember(
        [], [first, second, third]
    )
    assert a.account_usage(T0) == [first, second, third]


# --- leases ----------------------------------------------------------------------


def test_a_lapsed_member_s_runs_become_lost_and_it_can_write_nothing_more(
    ledger: FleetUnderTest,
) -> None:
    live, gone = ledger.member("live"), ledger.member("gone", lease=0.3)
    live.submit(run("r1", "c1"), T0)
    live.submit(run("r2", "c1"), T0)
    live.submit(run("queued", "c2"), T0)
    assert len(gone.claim_many([("r1", "acct")], T0).claimed) == 1
    assert live.expire_lapsed(T0 + 1) == []
    ledger.pause(0.5)
    lost = live.expire_lapsed(T0 + 2)
    assert [(r.id, r.status, r.reason, r.finished_at) for r in lost] == [
        ("r1", RunStatus.LOST, "supervisor gone:100 lease expired", T0 + 2)
    ]
    assert [m.host for m in live.members()] == ["live"]
    assert ids(live.claim_many([("r2", None)], T0 + 3).claimed) == ["r2"]
    assert live.claim_many([("r1", None)], T0 + 3).refused == [("r1", Refusal.GONE)]
    with pytest.raises(LeaseExpired, match="expired"):
        gone.renew()
    with pytest.raises(LeaseExpired):
        gone.claim_many([("queued", None)], T0 + 4)
    with pytest.raises(StoreConflict):
        gone.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 4)
    assert status(live, "r1") is RunStatus.LOST
    assert status(live, "queued") is RunStatus.QUEUED


def test_a_lapsed_lease_is_not_revived_even_before_anyone_expires_it(
    ledger: FleetUnderTest,
) -> None:
    a = ledger.member("a", lease=0.2)
    a.submit(run("r1"), T0)
    ledger.pause(0.4)
    with pytest.raises(LeaseExpired):
        a.renew()
    with pytest.raises(LeaseExpired):
        a.claim_many([("r1", None)], T0)
    with pytest.raises(LeaseExpired):
        a.expire_lapsed(T0)
    assert status(a, "r1") is RunStatus.QUEUED


def test_renewing_keeps_a_member_and_its_runs(ledger: FleetUnderTest) -> None:
    watcher, busy = ledger.member("watcher"), ledger.member("busy", lease=0.6)
    watcher.submit(run("r1", "c1"), T0)
    busy.claim_many([("r1", None)], T0)
    first = busy.renew()
    for _ in range(4):
        ledger.pause(0.2)
        assert busy.renew() >= first
        assert watcher.expire_lapsed(T0) == []
    busy.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 1)
    assert [m.host for m in watcher.members()] == ["busy", "watcher"]


def test_a_renewal_moves_the_local_end_of_the_lease_on(ledger: FleetUnderTest) -> None:
    a = ledger.member("a", lease=60)
    before = a.lease_end_local
    ledger.pause(0.1)
    a.lease = 30  # as a reload does
    end = a.renew()
    assert a.lease_end_local < before
    view = a.view()
    assert [m.lease_until for m in view.members] == [end]
    assert end - view.clock <= 30


def test_a_lapsed_member_is_expired_only_once_the_margin_has_passed(
    ledger: FleetUnderTest,
) -> None:
    watcher, gone = ledger.member("w", margin=1.0), ledger.member("gone", lease=0.2)
    watcher.submit(run("r1", "c1"), T0)
    watcher.submit(run("r2", "c1"), T0)
    gone.claim_many([("r1", None)], T0)
    ledger.pause(0.5)
    assert watcher.expire_lapsed(T0 + 1) == []
    assert watcher.claim_many([("r2", None)], T0 + 1).refused == [("r2", Refusal.LANE_BUSY)]
    ledger.pause(1.0)
    assert ids(watcher.expire_lapsed(T0 + 2)) == ["r1"]
    assert ids(watcher.claim_many([("r2", None)], T0 + 2).claimed) == ["r2"]


def test_a_member_that_leaves_waives_the_margin(ledger: FleetUnderTest) -> None:
    stays, leaving = ledger.member("stays", margin=2.0), ledger.member("leaving")
    stays.submit(run("r1"), T0)
    leaving.claim_many([("r1", None)], T0)
    leaving.leave()
    assert ids(stays.expire_lapsed(T0 + 1)) == ["r1"]
    assert [m.host for m in leaving.members()] == ["stays"]


def test_a_lease_must_be_a_positive_number_of_seconds(ledger: FleetUnderTest) -> None:
    for lease in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(StoreError, match="positive number of seconds"):
            ledger.member("a", lease=lease)


def test_a_closed_connection_refuses_every_call(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1"), T0)
    a.close()
    with pytest.raises(StoreError):
        a.get("r1")
    with pytest.raises(StoreError):
        a.renew()
    with pytest.raises(StoreError):
        a.claim_many([("r1", None)], T0)
    # The ledger, and the member's lease in it, are still there for the others.
    assert status(b, "r1") is RunStatus.QUEUED
    assert len(b.members()) == 2


# --- polls, cancels and re-queues ------------------------------------------------------


def test_a_member_polls_the_runs_queued_after_the_last_it_saw(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1"), T0)
    b.submit(run("r2"), T0)
    first = a.poll(0)
    assert ids(first.runs) == ["r1", "r2"]
    assert (first.cancels, first.left) == ([], [])
    b.submit(run("r3"), T0)
    b.claim_many([("r1", None)], T0)
    second = a.poll(first.cursor, ["r1", "r2", "ghost"])
    assert ids(second.runs) == ["r3"]
    assert second.left == ["r1", "ghost"]
    assert second.cursor > first.cursor
    assert a.poll(second.cursor).runs == []
    assert a.left_queue(["r3", "r1"]) == ["r1"]


def test_a_run_requeued_by_one_member_is_polled_again_by_every_member(
    ledger: FleetUnderTest,
) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1", "c1"), T0)
    a.submit(run("r2", "c1"), T0)
    cursor = b.poll(0).cursor
    a.claim_many([("r1", "work")], T0)

    def limited(store: Any) -> Any:
        store.finish("r1", RunEnd(RunStatus.USAGE_LIMITED, exit_code=1), T0 + 1)
        return store.requeue("r1")

    (done,) = a.apply([limited])
    assert done.unwrap().status is RunStatus.QUEUED
    again = b.poll(cursor)
    assert ids(again.runs) == ["r1"]
    assert again.runs[0].account is None
    assert b.poll(again.cursor).runs == []
    assert ids(b.claim_many([("r1", None)], T0 + 2).claimed) == ["r1"]


def test_a_cancel_asked_through_a_member_reaches_the_holder_s_poll_only(
    ledger: FleetUnderTest,
) -> None:
    holder, asker = ledger.member("holder"), ledger.member("asker")
    asker.submit(run("r1"), T0)
    holder.claim_many([("r1", None)], T0)
    record, cancelled = asker.request_cancel("r1", T0 + 1, "first")
    assert (record.status, cancelled) == (RunStatus.RUNNING, False)
    asker.request_cancel("r1", T0 + 2, "second")
    assert holder.poll(0).cancels == [("r1", "first")]
    assert asker.poll(0).cancels == []
    holder.finish("r1", RunEnd(RunStatus.CANCELLED, reason="first"), T0 + 3)
    assert holder.poll(0).cancels == []
    ended, cancelled = asker.request_cancel("r1", T0 + 4, "again")
    assert (ended.status, cancelled) == (RunStatus.CANCELLED, False)
    with pytest.raises(RunNotFound):
        asker.request_cancel("ghost", T0, "why")


def test_a_cancel_asked_of_a_queued_run_cancels_it_at_once(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1"), T0)
    record, cancelled = b.request_cancel("r1", T0 + 1, "no longer needed")
    assert (record.status, record.reason, record.finished_at, cancelled) == (
        RunStatus.CANCELLED,
        "no longer needed",
        T0 + 1,
        True,
    )


def test_a_requeue_that_meets_a_cancel_request_records_the_run_cancelled(
    ledger: FleetUnderTest,
) -> None:
    holder, asker = ledger.member("holder"), ledger.member("asker")
    asker.submit(run("r1"), T0)
    holder.claim_many([("r1", "work")], T0)
    asker.request_cancel("r1", T0 + 1, "stop it")
    holder.finish("r1", RunEnd(RunStatus.USAGE_LIMITED, exit_code=1, reason="limit"), T0 + 2)
    record = holder.requeue("r1")
    assert (record.status, record.reason, record.exit_code) == (RunStatus.CANCELLED, "stop it", 1)
    assert status(asker, "r1") is RunStatus.CANCELLED


def test_a_requeue_without_a_cancel_request_queues_the_run_again(
    ledger: FleetUnderTest,
) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1"), T0)
    a.claim_many([("r1", "work")], T0 + 1)
    b.request_cancel("r1", T0 + 1, "only for r2")  # another run's request changes nothing
    a.submit(run("r2"), T0)
    b.claim_many([("r2", "work")], T0 + 1)
    b.finish("r2", RunEnd(RunStatus.USAGE_LIMITED, exit_code=1, reason="limit"), T0 + 2)
    record = b.requeue("r2")
    assert (record.status, record.reason, record.attempts, record.account) == (
        RunStatus.QUEUED,
        None,
        1,
        None,
    )
    assert b.held_by("r2") is None


def test_cancelling_queued_runs_and_notes(ledger: FleetUnderTest) -> None:
    a = ledger.member("a")
    a.submit(run("r1"), T0)
    a.submit(run("r2"), T0)
    assert a.cancel_queued("r1", T0 + 1, "gone").status is RunStatus.CANCELLED
    a.claim_many([("r2", None)], T0 + 1)
    with pytest.raises(StoreConflict):
        a.cancel_queued("r2", T0 + 2, "too late")
    assert a.add_note("r2", "a note").notes == ("a note",)


# --- submits, lanes and the view ---------------------------------------------------------


def test_a_skip_submit_is_skipped_when_its_lanes_are_busy_anywhere(
    ledger: FleetUnderTest,
) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("queued", "c1"), T0)
    b.submit(run("running", "c2", agent="x"), T0)
    b.claim_many([("running", None)], T0)
    skipped, made = b.submit_unless_busy(run("s1", "c1"), T0 + 1, "busy", agent_exclusive=True)
    assert (skipped.status, skipped.reason, made) == (RunStatus.SKIPPED, "busy", True)
    by_agent, _ = a.submit_unless_busy(
        run("s2", "c9", agent="x"), T0 + 1, "busy", agent_exclusive=True
    )
    assert by_agent.status is RunStatus.SKIPPED
    loose, _ = a.submit_unless_busy(
        run("s3", "c9", agent="x"), T0 + 1, "busy", agent_exclusive=False
    )
    assert loose.status is RunStatus.QUEUED
    again, made = a.submit_unless_busy(run("s3", "c1"), T0 + 2, "busy", agent_exclusive=True)
    assert (again.status, made) == (RunStatus.QUEUED, False)
    elsewhere, _ = a.submit_unless_busy(
        run("s4", "c1", workspace="w2"), T0 + 1, "busy", agent_exclusive=True
    )
    assert elsewhere.status is RunStatus.QUEUED


def test_live_conversations_are_those_with_a_queued_or_running_run(
    ledger: FleetUnderTest,
) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("q", "c1"), T0)
    a.submit(run("r", "c2"), T0)
    a.submit(run("done", "c3"), T0)
    b.claim_many([("r", None), ("done", None)], T0)
    b.finish("done", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 1)
    candidates = [("default", "c1"), ("default", "c2"), ("default", "c3"), ("w2", "c1")]
    assert a.live_conversations(candidates) == {("default", "c1"), ("default", "c2")}


def test_the_fleet_view_counts_running_runs_per_member_and_provider(
    ledger: FleetUnderTest,
) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    for run_id, provider in (("r1", "claude"), ("r2", "claude"), ("r3", "codex")):
        a.submit(run(run_id, provider=provider), T0)
    a.claim_many([("r1", None), ("r3", None)], T0)
    b.claim_many([("r2", None)], T0)
    view = a.view()
    assert [m.id for m in view.members] == sorted([a.member_id, b.member_id])
    assert view.running == {
        (a.member_id, "claude"): 1,
        (a.member_id, "codex"): 1,
        (b.member_id, "claude"): 1,
    }


def test_an_operation_that_fails_in_a_batch_leaves_nothing_of_itself(
    ledger: FleetUnderTest,
) -> None:
    a = ledger.member("a")
    a.submit(run("r1"), T0)
    a.claim_many([("r1", "work")], T0)

    def half(store: Any) -> None:
        store.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 1)
        store.requeue("r1")  # succeeded cannot be re-queued

    (failed,) = a.apply([half])
    with pytest.raises(StoreConflict):
        failed.unwrap()
    assert status(a, "r1") is RunStatus.RUNNING
    assert a.held_by("r1") == a.member_id


def test_a_pruned_run_leaves_the_fleet_s_tables_too(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1", "c1"), T0)
    b.claim_many([("r1", None)], T0)
    b.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 1)
    assert a.prune(T0 + 2) == 1
    assert a.get("r1") is None
    assert a.claim_many([("r1", None)], T0 + 3).refused == [("r1", Refusal.GONE)]
    assert a.account_usage_by_member(T0).elsewhere == []


def test_runs_no_member_holds_are_lost_at_the_next_expiry(ledger: FleetUnderTest) -> None:
    a, b = ledger.member("a"), ledger.member("b")
    a.submit(run("r1"), T0)
    b.claim_many([("r1", None)], T0)
    b.leave()
    (lost,) = a.expire_lapsed(T0 + 1)
    assert lost.reason != LOST_ON_RESTART
    assert a.expire_lapsed(T0 + 2) == []


# --- the two, side by side -------------------------------------------------------------

_MEMBERS = 3
_RUN_IDS = [f"r{n}" for n in range(7)]
#: Runs every program begins with, each queued by a member in turn.
_FIRST = 4
_conversations = st.sampled_from([None, "c1", "c2"])
_agents = st.sampled_from([None, None, "x"])
_submit = st.tuples(
    st.just("submit"),
    st.integers(0, _MEMBERS - 1),
    st.sampled_from(_RUN_IDS[_FIRST:]),
    _conversations,
    _agents,
    st.booleans(),
)
_claim = st.tuples(
    st.just("claim"),
    st.integers(0, _MEMBERS - 1),
    st.lists(
        st.tuples(st.sampled_from(_RUN_IDS), st.sampled_from([None, "w1", "w2"])),
        min_size=1,
        max_size=4,
    ),
    st.booleans(),
)
# Submits and claims are drawn three times as often as each other call.
_operation = st.one_of(
    _submit,
    _submit,
    _claim,
    _claim,
    _submit,
    _claim,
    st.tuples(
        st.just("end"),
        st.integers(0, _MEMBERS - 1),
        st.sampled_from(_RUN_IDS),
        st.sampled_from(["succeeded", "usage_limited", "cancelled", "failed"]),
    ),
    st.tuples(st.just("cancel"), st.integers(0, _MEMBERS - 1), st.sampled_from(_RUN_IDS)),
    st.tuples(st.just("poll"), st.integers(0, _MEMBERS - 1)),
    st.tuples(st.just("rest"), st.integers(0, _MEMBERS - 1), st.sampled_from(["w1", "w2"])),
    st.tuples(st.just("leave"), st.integers(0, _MEMBERS - 1)),
)


_RULES = ClaimRules(
    provider_caps={"claude": 1},
    account_budgets={("claude", "w1"): AccountBudget(HOUR, 2, "runs")},
)


def _ended(run_id: str, how: str, now: float) -> Any:
    """The operation a member's finish is: a usage limit re-queues the run in it, and so
    does a failure (a retry). Each reports Codex's running totals of one session, grown
    with time: what a run records is its totals less the session's earlier runs' and
    its own earlier attempts' (on the same account)."""
    from herdsman.runtime.runner.run_usage import RunUsage, Tokens

    def end(ledger: Any) -> Any:
        grown = int(now - T0) + 1
        usage = RunUsage(tokens=Tokens(input=10 * grown, output=grown), session_totals=True)
        ending = RunEnd(RunStatus(how), exit_code=0, session_id="s", usage=usage)
        final = ledger.finish(run_id, ending, now)
        if final.status is RunStatus.USAGE_LIMITED:
            final = ledger.requeue(run_id)
        elif final.status is RunStatus.FAILED:
            final = ledger.requeue(run_id, failure="crash", retry_at=now)
        return final.status

    return end


def _step(
    stores: list[FleetLedger], cursors: list[int], operation: tuple[Any, ...], now: float
) -> Any:
    """One drawn call, made by its member; what it answered."""
    kind, who = operation[0], operation[1]
    store = stores[who]
    if kind == "submit":
        _, _, run_id, conversation, agent, skip = operation
        new = run(run_id, conversation, agent)
        if skip:
            return store.submit_unless_busy(new, now, "busy", agent_exclusive=True)[0].status
        return store.submit(new, now)[0].status
    if kind == "claim":
        _, _, items, exclusive = operation
        rules = _RULES if exclusive else ClaimRules(agent_exclusive=False)
        result = store.claim_many(items, now, rules)
        return ids(result.claimed), result.refused
    if kind == "end":
        (done,) = store.apply([_ended(operation[2], operation[3], now)])
        return done.unwrap()
    if kind == "cancel":
        record, cancelled = store.request_cancel(operation[2], now, "asked")
        return record.status, cancelled
    if kind == "poll":
        poll = store.poll(cursors[who], [r.id for r in store.queued_in_order()])
        cursors[who] = poll.cursor
        return ids(poll.runs), poll.cancels, poll.left
    if kind == "rest":
        store.set_account_limit("claude", operation[2], now + 3, "limit")
        return None
    store.leave()
    return ids(stores[(who + 1) % len(stores)].expire_lapsed(now))


def _play(
    fleet: FleetUnderTest,
    lanes: list[tuple[str | None, str | None]],
    program: list[tuple[Any, ...]],
) -> list[Any]:
    """Queue a run on each of ``lanes``, then run ``program`` on ``fleet``; what each step
    answered (an error by its type) and the ledger at the end."""
    stores = [fleet.member(f"m{n}") for n in range(_MEMBERS)]
    for n, (conversation, agent) in enumerate(lanes):
        stores[n % _MEMBERS].submit(run(f"r{n}", conversation, agent), T0 - 1)
    names = {store.member_id: f"m{n}" for n, store in enumerate(stores)}
    cursors = [0] * _MEMBERS
    out: list[Any] = []
    for step, operation in enumerate(program):
        try:
            out.append(_step(stores, cursors, operation, T0 + step))
        except StoreError as error:
            out.append(type(error).__name__)
    usage = stores[0].account_usage_by_member(T0)
    out.append((usage.mine, usage.elsewhere))
    running = stores[0].view().running.items()
    out.append(sorted((names.get(h or "", h), p, n) for (h, p), n in running))
    out.append(
        [(r.id, r.status, r.attempts, r.account, r.reason, r.spend) for r in stores[1].list_runs()]
    )
    out.append([(r.id, [a.spend for a in stores[2].attempts(r.id)]) for r in stores[1].list_runs()])
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    lanes=st.lists(st.tuples(_conversations, _agents), min_size=_FIRST, max_size=_FIRST),
    program=st.lists(_operation, min_size=8, max_size=30),
)
def test_both_ledgers_answer_every_drawn_program_alike(
    postgres_server: str,
    lanes: list[tuple[str | None, str | None]],
    program: list[tuple[Any, ...]],
) -> None:
    """Both fed the same calls by the same members: every answer and the ledger at the end."""
    with fresh_schema(postgres_server) as url:
        real = PostgresFleet(url)
        try:
            expected = _play(real, lanes, program)
        finally:
            real.close()
    fake = SimulatedFleet()
    try:
        assert _play(fake, lanes, program) == expected
    finally:
        fake.close()
