"""FleetStore on a real server: members, leases, expiry and the claim rules, example by example.

The claim rules under interleavings and races are in test_fleet_properties.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from herdsman.runtime.fence_keeper import fence_clock
from herdsman.runtime.store import NewRun, RunEnd, RunStatus, StoreConflict, StoreError, postgres
from herdsman.runtime.store.fleet import (
    FENCE_MARGIN,
    ClaimRules,
    FleetStore,
    LeaseExpired,
    Refusal,
    lease_expired_reason,
)
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.store.records import LOST_ON_RESTART
from postgres_support import end_lease, fleet_lock_waiters, fresh_schema, lease_left, ledger_member

T0 = 1_700_000_000.0


member = ledger_member


@contextmanager
def fleet(url: str, *names: str, lease: float = 60.0) -> Iterator[list[FleetStore]]:
    stores = [member(url, name, lease) for name in names]
    try:
        yield stores
    finally:
        for store in stores:
            store.close()


def run(
    run_id: str,
    conversation: str | None = None,
    agent: str | None = None,
    provider: str = "claude",
    workspace: str = "default",
) -> NewRun:
    return NewRun(
        id=run_id,
        provider=provider,
        prompt="p",
        conversation=conversation,
        agent=agent,
        workspace=workspace,
    )


def test_a_run_is_claimed_once_and_held_by_its_claimant(postgres_url: str) -> None:
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1"), T0)
        first = b.claim_many([("r1", "acct")], T0 + 1)
        second = a.claim_many([("r1", "acct")], T0 + 2)
        assert [r.id for r in first.claimed] == ["r1"]
        assert first.claimed[0].account == "acct"
        assert second.claimed == []
        assert second.refused == [("r1", Refusal.GONE)]
        assert a.held_by("r1") == b.member_id
        assert [r.id for r in a.running_elsewhere()] == ["r1"]
        assert b.running_elsewhere() == []
        record = a.get("r1")
        assert record is not None
        assert (record.status, record.attempts) == (RunStatus.RUNNING, 1)


def test_only_the_holder_records_how_a_running_run_ended(postgres_url: str) -> None:
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1"), T0)
        a.claim_many([("r1", None)], T0)
        with pytest.raises(StoreConflict, match="on this supervisor"):
            b.finish("r1", RunEnd(RunStatus.FAILED, exit_code=1), T0 + 1)
        assert a.held_by("r1") == a.member_id
        final = a.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 2)
        assert final.status is RunStatus.SUCCEEDED
        assert a.held_by("r1") is None


def test_a_run_on_a_lane_running_elsewhere_is_refused_until_it_ends(postgres_url: str) -> None:
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1"), T0)
        a.submit(run("r2", "c1"), T0)
        a.submit(run("other", "c2"), T0)
        assert [r.id for r in a.claim_many([("r1", None)], T0).claimed] == ["r1"]
        refused = b.claim_many([("r2", None), ("other", None)], T0)
        assert refused.refused == [("r2", Refusal.LANE_BUSY)]
        assert [r.id for r in refused.claimed] == ["other"]
        a.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 1)
        assert [r.id for r in b.claim_many([("r2", None)], T0 + 2).claimed] == ["r2"]


def test_a_run_behind_an_earlier_queued_run_on_its_lane_waits(postgres_url: str) -> None:
    """FIFO per key fleet-wide: the conversation key, and the agent key while exclusive."""
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1", agent="x"), T0)
        b.submit(run("r2", "c1"), T0)
        b.submit(run("r3", "c9", agent="x"), T0)
        b.submit(run("r4", "c1", workspace="elsewhere"), T0)
        result = b.claim_many([("r2", None), ("r3", None), ("r4", None)], T0)
        assert result.refused == [("r2", Refusal.EARLIER_QUEUED), ("r3", Refusal.EARLIER_QUEUED)]
        # Keys are scoped by workspace: the same conversation id elsewhere is free.
        assert [r.id for r in result.claimed] == ["r4"]
        loose = b.claim_many([("r3", None)], T0, ClaimRules(agent_exclusive=False))
        assert [r.id for r in loose.claimed] == ["r3"]


def test_items_of_one_claim_see_the_claims_before_them(postgres_url: str) -> None:
    with fleet(postgres_url, "a") as (a,):
        a.submit(run("r1", "c1", agent="x"), T0)
        a.submit(run("r2", "c2", agent="x"), T0)
        result = a.claim_many([("r1", None), ("r2", None)], T0, ClaimRules(agent_exclusive=True))
        assert [r.id for r in result.claimed] == ["r1"]
        assert result.refused == [("r2", Refusal.LANE_BUSY)]


def test_fleet_wide_caps_per_provider_and_per_account(postgres_url: str) -> None:
    rules = ClaimRules(provider_caps={"claude": 2}, account_caps={("codex", "team"): 1})
    with fleet(postgres_url, "a", "b") as (a, b):
        for n in range(3):
            a.submit(run(f"c{n}"), T0)
            a.submit(run(f"x{n}", provider="codex"), T0)
        assert len(a.claim_many([("c0", None)], T0, rules).claimed) == 1
        assert b.claim_many([("c1", None), ("c2", None)], T0, rules).refused == [
            ("c2", Refusal.PROVIDER_CAP)
        ]
        result = b.claim_many([("x0", "team"), ("x1", "team"), ("x2", "solo")], T0, rules)
        assert result.refused == [("x1", Refusal.ACCOUNT_CAP)]
        assert [r.id for r in result.claimed] == ["x0", "x2"]
        a.finish("c0", RunEnd(RunStatus.FAILED, exit_code=1), T0 + 1)
        assert [r.id for r in b.claim_many([("c2", None)], T0 + 1, rules).claimed] == ["c2"]


def test_a_negative_fleet_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="'claude'"):
        ClaimRules(provider_caps={"claude": -1})


def test_a_lapsed_member_s_runs_become_lost_and_it_can_write_nothing_more(
    postgres_url: str,
) -> None:
    with fleet(postgres_url, "live") as (live,):
        gone = member(postgres_url, "gone")
        try:
            live.submit(run("r1", "c1"), T0)
            live.submit(run("r2", "c1"), T0)
            live.submit(run("queued", "c2"), T0)
            assert len(gone.claim_many([("r1", "acct")], T0).claimed) == 1
            assert live.expire_lapsed(T0 + 1) == []  # the lease still holds
            end_lease(postgres_url, gone.member_id)
            lost = live.expire_lapsed(T0 + 2)
            assert [(r.id, r.status, r.reason) for r in lost] == [
                ("r1", RunStatus.LOST, "supervisor gone:100 lease expired")
            ]
            assert [m.host for m in live.members()] == ["live"]
            # The lane is free again, and the run is never run again.
            assert [r.id for r in live.claim_many([("r2", None)], T0 + 3).claimed] == ["r2"]
            assert live.claim_many([("r1", None)], T0 + 3).refused == [("r1", Refusal.GONE)]
            # The member comes back: it can renew, claim and finish nothing.
            with pytest.raises(LeaseExpired, match="expired"):
                gone.renew()
            with pytest.raises(LeaseExpired):
                gone.claim_many([("queued", None)], T0 + 4)
            with pytest.raises(StoreConflict):
                gone.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 4)
            record = live.get("r1")
            assert record is not None
            assert record.status is RunStatus.LOST
            queued = live.get("queued")
            assert queued is not None
            assert queued.status is RunStatus.QUEUED
        finally:
            gone.close()


def test_a_lapsed_lease_is_not_revived_even_before_anyone_expires_it(postgres_url: str) -> None:
    with fleet(postgres_url, "a", lease=0.2) as (a,):
        a.submit(run("r1"), T0)
        time.sleep(0.4)
        with pytest.raises(LeaseExpired):
            a.renew()
        with pytest.raises(LeaseExpired):
            a.claim_many([("r1", None)], T0)
        with pytest.raises(LeaseExpired):
            a.expire_lapsed(T0)


def test_renewing_keeps_a_member_and_its_runs(postgres_url: str) -> None:
    with fleet(postgres_url, "watcher") as (watcher,):
        busy = member(postgres_url, "busy", lease=600)
        try:
            watcher.submit(run("r1", "c1"), T0)
            busy.claim_many([("r1", None)], T0)
            first = busy.renew()
            for _ in range(4):
                # Nearly over, as if time had passed: each renewal gives it
                # its whole lease again.
                end_lease(postgres_url, busy.member_id, ago=-60)
                renewed = busy.renew()
                assert renewed >= first
                assert lease_left(postgres_url, busy.member_id) > 60
                assert watcher.expire_lapsed(T0) == []
            busy.finish("r1", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 1)
            # Members come back by id, which begins with the host here.
            assert [m.host for m in watcher.members()] == ["busy", "watcher"]
        finally:
            busy.close()


def test_a_member_that_leaves_is_expired_with_what_it_still_held(postgres_url: str) -> None:
    with fleet(postgres_url, "stays") as (stays,):
        leaving = member(postgres_url, "leaving")
        try:
            stays.submit(run("r1"), T0)
            leaving.claim_many([("r1", None)], T0)
            leaving.leave()
            lost = stays.expire_lapsed(T0 + 1)
            gone = leaving.members()
            assert [r.id for r in lost] == ["r1"]
            assert [m.host for m in gone] == ["stays"]
        finally:
            leaving.close()


def test_a_lapsed_member_is_expired_only_once_the_fence_margin_has_passed(
    postgres_url: str,
) -> None:
    watcher = FleetStore(
        postgres_url, member_id=f"w-{uuid.uuid4().hex[:8]}", host="w", pid=1, lease=60, margin=60
    )
    gone = member(postgres_url, "gone")
    try:
        watcher.submit(run("r1", "c1"), T0)
        watcher.submit(run("r2", "c1"), T0)
        gone.claim_many([("r1", None)], T0)
        end_lease(postgres_url, gone.member_id)  # the lease is over; the margin is not
        assert watcher.expire_lapsed(T0 + 1) == []
        # Its run holds the conversation until then.
        assert watcher.claim_many([("r2", None)], T0 + 1).refused == [("r2", Refusal.LANE_BUSY)]
        end_lease(postgres_url, gone.member_id, ago=61)
        assert [r.id for r in watcher.expire_lapsed(T0 + 2)] == ["r1"]
        assert [r.id for r in watcher.claim_many([("r2", None)], T0 + 2).claimed] == ["r2"]
    finally:
        gone.close()
        watcher.close()


def test_a_member_that_leaves_waives_the_fence_margin(postgres_url: str) -> None:
    # Both with the margin every supervisor uses: the one that leaves has
    # closed its fence first (its agents are gone).
    stays, leaving = (
        FleetStore(postgres_url, member_id=f"{n}-{uuid.uuid4().hex[:8]}", host=n, pid=1, lease=60)
        for n in ("stays", "leaving")
    )
    try:
        assert stays.margin == FENCE_MARGIN
        stays.submit(run("r1"), T0)
        leaving.claim_many([("r1", None)], T0)
        leaving.leave()
        assert [r.id for r in stays.expire_lapsed(T0 + 1)] == ["r1"]
    finally:
        leaving.close()
        stays.close()


def test_the_local_end_of_the_lease_is_read_before_the_server_sets_it(
    postgres_url: str,
) -> None:
    # The server's clock_timestamp() is read after the member's clock: the
    # lease ends on the member's clock no later than on the server's.
    with fleet(postgres_url, "a", lease=60) as (a,):
        before = fence_clock()
        a.renew()
        after = fence_clock()
        assert before + 60 <= a.lease_end_local <= after + 60
        a.lease = 30  # as a reload does
        a.renew()
        assert a.lease_end_local <= fence_clock() + 30


def test_the_lost_reason_names_the_member() -> None:
    from herdsman.runtime.store.fleet import Member

    assert lease_expired_reason(Member("id", "db1", 42, 0.0, 1.0)) == (
        "supervisor db1:42 lease expired"
    )


def test_a_member_neither_recovers_nor_starts_without_claiming(postgres_url: str) -> None:
    with fleet(postgres_url, "a") as (a,):
        a.submit(run("r1"), T0)
        with pytest.raises(StoreError, match="claim_many"):
            a.mark_running_many([("r1", None)], T0)
        with pytest.raises(StoreError, match="expire_lapsed"):
            a.recover(T0)
        record = a.get("r1")
        assert record is not None
        assert record.status is RunStatus.QUEUED


def test_a_sole_supervisor_and_a_fleet_exclude_each_other(postgres_url: str) -> None:
    sole = PostgresStore(postgres_url, sole=True)
    try:
        with pytest.raises(StoreError, match=r"not a fleet member.*stop that supervisor"):
            member(postgres_url, "a")
    finally:
        sole.close()
    with fleet(postgres_url, "a", "b"), pytest.raises(StoreError, match="another herdsman"):
        PostgresStore(postgres_url, sole=True)


def test_a_lease_must_be_a_positive_number_of_seconds(postgres_url: str) -> None:
    for lease in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(StoreError, match="positive number of seconds"):
            member(postgres_url, "a", lease=lease)


def test_a_submit_waits_for_a_claim_in_progress(postgres_url: str) -> None:
    """Submits take the fleet lock, so seq order is commit order: a claim that
    found no earlier queued run on its lanes cannot have one committed under it."""
    with fleet(postgres_url, "a") as (a,), psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (a._fleet_lock,))
        done = threading.Event()

        def submit() -> None:
            a.submit(run("r1", "c1"), T0)
            done.set()

        thread = threading.Thread(target=submit)
        thread.start()
        try:
            # Wait until the submit is seen queuing for the lock, not for a time.
            for _ in range(500):
                assert a._fleet_lock is not None
                waiting = conn.execute(fleet_lock_waiters(a._fleet_lock)).fetchone()
                if waiting is not None and waiting[0]:
                    break
                time.sleep(0.01)
            else:
                raise AssertionError("the submit never waited for the fleet lock")
            assert not done.is_set()
        finally:
            conn.execute("COMMIT")
            thread.join()
        assert done.is_set()
        assert a.get("r1") is not None


def test_two_ledgers_in_one_database_do_not_wait_for_each_other(postgres_server: str) -> None:
    with (
        fresh_schema(postgres_server) as first_url,
        fresh_schema(postgres_server) as second_url,
        fleet(first_url, "a") as (first,),
        # A wait for the lock fails after 2 s instead of hanging the test.
        fleet(second_url + "%20-clock_timeout%3D2000", "b") as (second,),
        psycopg.connect(first_url, autocommit=True) as conn,
    ):
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (first._fleet_lock,))
        try:
            # With one lock per database these would wait for the first ledger's.
            second.submit(run("r1", "c1"), T0)
            assert [r.id for r in second.claim_many([("r1", None)], T0).claimed] == ["r1"]
        finally:
            conn.execute("COMMIT")


def waiting_for_a_lock(conn: psycopg.Connection[Any]) -> None:
    """Return once some session waits for a lock (row or advisory); fail after 5 s."""
    for _ in range(500):
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
        if row is not None and row[0]:
            return
        time.sleep(0.01)
    raise AssertionError("nothing ever waited for a lock")


def test_a_claim_sees_a_cancel_committed_before_it_and_refuses_only_that_run(
    postgres_url: str,
) -> None:
    """Every member's write takes the fleet lock first, so a cancel in a batch
    still being committed makes a claim wait, and then refuse that run as gone:
    the claim's other runs are claimed, not lost with a failed transaction."""
    with (
        fleet(postgres_url, "a", "b") as (a, b),
        psycopg.connect(postgres_url, autocommit=True) as conn,
    ):
        a.submit(run("x", "c1"), T0)
        a.submit(run("y", "c2"), T0)
        cancelled, release = threading.Event(), threading.Event()

        def cancel_and_hold(store: Any) -> None:
            store.cancel_queued("x", T0, "cancelled")
            cancelled.set()
            release.wait()

        batch = threading.Thread(target=lambda: b.apply([cancel_and_hold]))
        batch.start()
        results: list[Any] = []
        claim = threading.Thread(
            target=lambda: results.append(a.claim_many([("y", None), ("x", None)], T0))
        )
        try:
            assert cancelled.wait(5)
            claim.start()
            waiting_for_a_lock(conn)
        finally:
            release.set()
            batch.join()
            claim.join()
        (result,) = results
        assert [r.id for r in result.claimed] == ["y"]
        assert result.refused == [("x", Refusal.GONE)]


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda s: s.cancel_queued("r1", T0, "x"), id="cancel"),
        pytest.param(lambda s: s.add_note("r1", "note"), id="note"),
        pytest.param(lambda s: s.apply([lambda t: t.add_note("r1", "n")]), id="batch"),
        pytest.param(lambda s: s.renew(), id="renew"),
        pytest.param(lambda s: s.expire_lapsed(T0), id="expire"),
    ],
)
def test_every_write_of_a_member_takes_the_fleet_lock_first(postgres_url: str, write: Any) -> None:
    """One lock order for every writer: no interleaving, no deadlock."""
    with fleet(postgres_url, "a") as (a,), psycopg.connect(postgres_url, autocommit=True) as conn:
        a.submit(run("r1", "c1"), T0)
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (a._fleet_lock,))
        done = threading.Event()

        def write_then_say_so() -> None:
            write(a)
            done.set()

        thread = threading.Thread(target=write_then_say_so)
        thread.start()
        try:
            waiting_for_a_lock(conn)
            assert not done.is_set()
        finally:
            conn.execute("COMMIT")
            thread.join()
        assert done.is_set()


def test_running_runs_no_member_holds_are_lost_at_the_next_expiry(postgres_url: str) -> None:
    """A supervisor that held the ledger alone and died leaves running runs with
    no holder: the fleet declares them lost instead of letting them block lanes."""
    sole = PostgresStore(postgres_url, sole=True)
    sole.submit(run("old", "c1"), T0)
    sole.mark_running("old", T0, "acct")
    sole.submit(run("next", "c1"), T0)
    sole.close()
    with fleet(postgres_url, "a") as (a,):
        assert a.claim_many([("next", None)], T0 + 1).refused == [("next", Refusal.LANE_BUSY)]
        (lost,) = a.expire_lapsed(T0 + 2)
        assert (lost.id, lost.status, lost.reason) == ("old", RunStatus.LOST, LOST_ON_RESTART)
        assert [r.id for r in a.claim_many([("next", None)], T0 + 3).claimed] == ["next"]


def test_a_refused_member_leaves_an_older_ledger_unmigrated(postgres_url: str) -> None:
    """The shared lock is taken before the schema is read or migrated, as the sole one is."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        with conn.transaction():
            for statements in postgres.MIGRATIONS[:4]:
                for statement in statements:
                    conn.execute(statement)
            conn.execute("CREATE TABLE herdsman_schema (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO herdsman_schema VALUES (4)")
        # An older sole supervisor holds the ledger.
        conn.execute(
            "SELECT pg_advisory_lock((%s::bigint << 32) | oid::bigint) FROM pg_namespace"
            " WHERE nspname = current_schema()",
            (postgres.SOLE_SUPERVISOR_LOCK,),
        )
        with pytest.raises(StoreError, match="not a fleet member"):
            member(postgres_url, "a")
        version = conn.execute("SELECT version FROM herdsman_schema").fetchone()
        assert version == (4,)


def test_a_claim_whose_lease_lapses_before_it_commits_claims_nothing(postgres_url: str) -> None:
    """The lease is checked again last: a member never spawns a run already due to be lost."""
    with fleet(postgres_url, "a") as (a,):
        a.submit(run("x", "c1"), T0)
        original = a._check_live
        calls: list[int] = []

        def slow_check(cur: Any) -> None:
            calls.append(1)
            if len(calls) == 2:  # the check after the claims were written
                end_lease(postgres_url, a.member_id)
            original(cur)

        a._check_live = slow_check  # type: ignore[method-assign]
        with pytest.raises(LeaseExpired):
            a.claim_many([("x", None)], T0)
        assert len(calls) == 2  # refused by the check after the claims, not before
        a._check_live = original  # type: ignore[method-assign]
        record = a.get("x")
        assert record is not None
        assert record.status is RunStatus.QUEUED


def test_a_member_polls_the_runs_queued_after_the_last_it_saw(postgres_url: str) -> None:
    with fleet(postgres_url, "a", "b") as (a, b):
        for n in range(4):
            (a if n % 2 else b).submit(run(f"r{n}", f"c{n}"), T0 + n)
        polled = a.poll(0)
        everything = polled.runs
        assert [r.id for r in everything] == ["r0", "r1", "r2", "r3"]
        assert [r.seq for r in everything] == sorted(r.seq for r in everything)
        assert polled.cursor == everything[-1].seq
        b.claim_many([("r1", None)], T0 + 5)  # claimed: not queued any more
        b.cancel_queued("r2", T0 + 5, "no")
        after_r0 = b.poll(everything[0].seq)
        assert [r.id for r in after_r0.runs] == ["r3"]
        assert after_r0.cursor == everything[-1].seq
        assert a.poll(polled.cursor).runs == []
        assert a.poll(polled.cursor).cursor == polled.cursor


def test_a_claim_with_a_clock_stamps_its_starts_once_the_fleet_lock_is_held(
    postgres_url: str,
) -> None:
    with fleet(postgres_url, "a") as (a,):
        a.submit(run("r1", "c1"), T0)
        a.submit(run("r2", "c2"), T0)
        read: list[float] = []

        def clock() -> float:
            read.append(T0 + 9)
            return read[-1]

        claimed = a.claim_many([("r1", None), ("r2", None)], T0 + 1, clock=clock).claimed
        assert read == [T0 + 9]  # read once, for the whole claim
        assert [r.started_at for r in claimed] == [T0 + 9, T0 + 9]
        stored = a.get("r1")
        assert stored is not None
        assert stored.started_at == T0 + 9


def test_reads_take_no_fleet_lock_not_even_in_a_batch(postgres_url: str) -> None:
    """A member's poll (a batch of reads) goes on while another member writes."""
    with fleet(postgres_url, "a") as (a,), psycopg.connect(postgres_url, autocommit=True) as conn:
        a.submit(run("r1", "c1"), T0)
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (a._fleet_lock,))
        try:
            (polled,) = a.apply([lambda _: a.poll(0)])  # in the batch: s is a
            assert [r.id for r in polled.unwrap().runs] == ["r1"]
            assert a.get("r1") is not None
        finally:
            conn.execute("COMMIT")


def test_a_cancel_asked_through_a_member_reaches_the_holder_s_poll_only(postgres_url: str) -> None:
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1"), T0)
        b.claim_many([("r1", None)], T0 + 1)
        record, cancelled = a.request_cancel("r1", T0 + 2, "stop it")
        assert (record.status, cancelled) == (RunStatus.RUNNING, False)
        assert b.poll(0).cancels == [("r1", "stop it")]
        assert a.poll(0).cancels == []  # a does not hold it
        # Asked again (through either member): one request, the first reason.
        assert a.request_cancel("r1", T0 + 3, "again")[1] is False
        assert b.poll(0).cancels == [("r1", "stop it")]
        b.finish("r1", RunEnd(RunStatus.CANCELLED, reason="stop it"), T0 + 4)
        assert b.poll(0).cancels == []
        # Ended: answered as it is, changed in nothing.
        ended, cancelled = a.request_cancel("r1", T0 + 5, "late")
        assert (ended.status, ended.reason, ended.finished_at, cancelled) == (
            RunStatus.CANCELLED,
            "stop it",
            T0 + 4,
            False,
        )


def test_a_cancel_asked_of_a_queued_run_cancels_it_at_once(postgres_url: str) -> None:
    with fleet(postgres_url, "a") as (a,):
        a.submit(run("r1", "c1"), T0)
        record, cancelled = a.request_cancel("r1", T0 + 1, "not needed")
        assert (record.status, record.reason, cancelled) == (
            RunStatus.CANCELLED,
            "not needed",
            True,
        )
        stored = a.get("r1")
        assert stored is not None
        assert stored.status is RunStatus.CANCELLED


def test_a_cancel_asked_of_a_member_whose_lease_lapses_is_moot(postgres_url: str) -> None:
    with fleet(postgres_url, "a") as (a,), fleet(postgres_url, "b") as (b,):
        a.submit(run("r1", "c1"), T0)
        b.claim_many([("r1", None)], T0 + 1)
        a.request_cancel("r1", T0 + 2, "stop it")
        end_lease(postgres_url, b.member_id)
        (lost,) = a.expire_lapsed(T0 + 3)
        assert (lost.id, lost.status, lost.reason) == (
            "r1",
            RunStatus.LOST,
            "supervisor b:100 lease expired",
        )
        assert a.poll(0).cancels == []


def test_a_requeue_that_meets_a_cancel_request_records_the_run_cancelled(
    postgres_url: str,
) -> None:
    """The holder re-queues it (a usage limit) just as a cancel is asked: it ends cancelled."""
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1"), T0)
        a.submit(run("r2", "c1"), T0)
        cursor = b.poll(0).cursor
        a.claim_many([("r1", "acct")], T0 + 1)
        b.request_cancel("r1", T0 + 2, "stop it")
        a.finish("r1", RunEnd(RunStatus.USAGE_LIMITED, exit_code=1, reason="limit"), T0 + 3)
        record = a.requeue("r1")
        # Cancelled, not queued: no member could offer it while its account
        # rests, and it would hold its conversation fleet-wide meanwhile.
        assert (record.status, record.reason, record.finished_at, record.exit_code) == (
            RunStatus.CANCELLED,
            "stop it",
            T0 + 3,
            1,
        )
        stored = b.get("r1")
        assert stored == record
        assert b.poll(cursor).runs == []  # not polled again as re-queued
        # Its lane is free: the run behind it is claimed.
        assert [r.id for r in b.claim_many([("r2", None)], T0 + 4).claimed] == ["r2"]


def test_a_requeue_without_a_cancel_request_queues_the_run_again(postgres_url: str) -> None:
    with fleet(postgres_url, "a") as (a,):
        a.submit(run("r1", "c1"), T0)
        a.claim_many([("r1", "acct")], T0 + 1)
        a.finish("r1", RunEnd(RunStatus.USAGE_LIMITED, reason="limit"), T0 + 3)
        record = a.requeue("r1")
        assert (record.status, record.reason, record.attempts) == (RunStatus.QUEUED, None, 1)


def test_a_queued_run_left_with_a_cancel_request_is_cancelled_by_its_next_claim(
    postgres_url: str,
) -> None:
    """A request on a queued run, as a member of an earlier herdsman re-queued it, still holds."""
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1"), T0)
        a.claim_many([("r1", None)], T0 + 1)
        b.request_cancel("r1", T0 + 2, "stop it")
        a.finish("r1", RunEnd(RunStatus.USAGE_LIMITED, reason="limit"), T0 + 3)
        PostgresStore.requeue(a, "r1")  # the plain re-queue, which ignored the request
        result = b.claim_many([("r1", None)], T0 + 4)
        assert result.refused == [("r1", Refusal.GONE)]
        record = b.get("r1")
        assert record is not None
        assert (record.status, record.reason, record.finished_at) == (
            RunStatus.CANCELLED,
            "stop it",
            T0 + 4,
        )


def test_a_claim_refuses_a_run_the_ledger_does_not_hold_as_gone(postgres_url: str) -> None:
    """A run pruned after it ended elsewhere, still queued in a member's scheduler."""
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1"), T0)
        a.submit(run("r2", "c2"), T0)
        b.cancel_queued("r1", T0 + 1, "no")
        assert b.prune(T0 + 2) == 1
        result = a.claim_many([("r1", None), ("never", None), ("r2", None)], T0 + 3)
        assert result.refused == [("r1", Refusal.GONE), ("never", Refusal.GONE)]
        assert [r.id for r in result.claimed] == ["r2"]


def test_a_poll_says_which_runs_held_queued_have_left_the_queue(postgres_url: str) -> None:
    with fleet(postgres_url, "a", "b") as (a, b):
        for n in range(6):
            a.submit(run(f"r{n}", f"c{n}"), T0)
        b.claim_many([("r0", None)], T0 + 1)  # claimed by another member
        b.request_cancel("r1", T0 + 1, "no")  # cancelled
        b.claim_many([("r2", None)], T0 + 1)  # claimed and ended
        b.finish("r2", RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 2)
        b.cancel_queued("r3", T0 + 1, "no")
        b.prune(T0 + 1.5)  # r1 and r3 are gone from the ledger; r2 ended after
        held = ["r5", "r3", "r0", "unknown", "r4", "r1", "r2"]
        polled = a.poll(0, held)
        assert polled.left == ["r3", "r0", "unknown", "r1", "r2"]  # in the order given
        assert [r.id for r in polled.runs] == ["r4", "r5"]
        assert a.left_queue(held) == polled.left
        assert a.poll(polled.cursor).left == []  # nothing held, nothing left


def test_a_run_requeued_by_one_member_is_polled_again_by_every_member(postgres_url: str) -> None:
    with fleet(postgres_url, "a", "b") as (a, b):
        a.submit(run("r1", "c1"), T0)
        a.submit(run("r2", "c2"), T0)
        seen = b.poll(0)
        assert [r.id for r in seen.runs] == ["r1", "r2"]
        a.claim_many([("r1", None)], T0 + 1)
        assert b.poll(seen.cursor).runs == []
        a.finish("r1", RunEnd(RunStatus.USAGE_LIMITED, reason="limit"), T0 + 2)
        a.requeue("r1")
        a.submit(run("r3", "c3"), T0 + 3)
        again = b.poll(seen.cursor)
        # In seq order: the re-queued run keeps its place, before runs submitted after it.
        assert [r.id for r in again.runs] == ["r1", "r3"]
        assert again.runs[0].seq < seen.runs[1].seq < again.runs[1].seq
        assert again.cursor > seen.cursor
        assert b.poll(again.cursor).runs == []
        # Polled from its own cursor, the re-queuing member sees it too.
        assert [r.id for r in a.poll(seen.cursor).runs] == ["r1", "r3"]


def test_the_fleet_view_counts_running_runs_per_member_and_provider(postgres_url: str) -> None:
    with fleet(postgres_url, "a", "b") as (a, b):
        for n, provider in enumerate(("claude", "claude", "codex", "claude")):
            a.submit(run(f"r{n}", f"c{n}", provider=provider), T0)
        a.claim_many([("r0", None), ("r2", None)], T0 + 1)
        b.claim_many([("r1", None)], T0 + 1)
        view = b.view()
        assert sorted(m.id for m in view.members) == sorted([a.member_id, b.member_id])
        assert view.running == {
            (a.member_id, "claude"): 1,
            (a.member_id, "codex"): 1,
            (b.member_id, "claude"): 1,
        }
        assert all(0 < m.lease_until - view.clock <= 60 for m in view.members)
        assert abs(view.clock - time.time()) < 60  # the server's clock, not the runs' T0
