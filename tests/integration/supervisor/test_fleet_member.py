"""One supervisor as a fleet member, served in the test, beside a member the test drives.

The test's own :class:`FleetStore` plays the rest of the fleet: it runs runs
the supervisor must wait for, and it can make the supervisor's lease lapse.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
from cli_support import process_alive, processes_with_env
from supervisor_support import (
    Running,
    Start,
    git_repository,
    unrecorded_finish,
    write_config,
)
from test_accounts import limit, provider_block

from herdsman import status_cli
from herdsman.config import load_config_text
from herdsman.core import RunState
from herdsman.runtime.api import app
from herdsman.runtime.fleet_member import FleetMember
from herdsman.runtime.store import NewRun, RunEnd, RunRecord, RunStatus, Store, StoreError
from herdsman.runtime.store.fleet import ClaimRules, FleetStore
from herdsman.runtime.supervisor import SKIP_REASON
from herdsman.runtime.worktrees.sweeper import SweepReport
from postgres_support import fleet_lock_waiters, lease_left, split_password


@pytest.fixture
def member_url(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    url, password = split_password(postgres_url)
    if password is not None:
        monkeypatch.setenv("PGPASSWORD", password)
    return url


@pytest.fixture
def other(postgres_url: str) -> Iterator[FleetStore]:
    """Another member of the fleet, driven by the test."""
    store = FleetStore(
        postgres_url, member_id=f"other-{uuid.uuid4().hex[:8]}", host="other", pid=1, lease=60
    )
    try:
        yield store
    finally:
        store.close()


def fleet_config(
    directory: Path,
    url: str,
    *,
    lease: str = "3s",
    poll: str = "1s",
    more: str = "",
    delay: float = 0.1,
    concurrency: int = 2,
) -> Path:
    fleet = f'[fleet]\nenabled = true\nlease = "{lease}"\npoll = "{poll}"\n{more}'
    return write_config(
        directory, concurrency=concurrency, delay=delay, extra=f'[store]\nurl = "{url}"\n{fleet}'
    )


def run_elsewhere(other: FleetStore, run_id: str, conversation: str) -> None:
    other.submit(NewRun(id=run_id, provider="demo", prompt="p", conversation=conversation), 1.0)
    assert [r.id for r in other.claim_many([(run_id, None)], 2.0).claimed] == [run_id]


def status_of(store: Store, run_id: str) -> RunStatus:
    record = store.get(run_id)
    assert record is not None
    return record.status


def parked(running: Running) -> list[str]:
    """The runs parked by ``running``: held by its scheduler, its claim refused."""
    return running.supervisor.parked_runs()


async def wait_parked(running: Running, run_id: str) -> None:
    with trio.fail_after(10):
        while run_id not in parked(running):
            await trio.sleep(0.02)


async def stop_asked(running: Running, run_id: str) -> None:
    """Wait until a cancel has asked the running ``run_id`` to stop here.

    The cancel is then decided, and waits behind whatever the ledger is
    doing (a claim held up by the test): a fixed sleep could let it arrive
    after the claim, and the test would pass by another path.
    """
    with trio.fail_after(10):
        while not running.supervisor.stop_asked(run_id):
            await trio.sleep(0.01)


def fleet_of(running: Running) -> FleetMember:
    fleet = running.supervisor.fleet
    assert isinstance(fleet, FleetMember)
    return fleet


async def parked_behind_another_member(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore, lease: str = "3s"
) -> tuple[Running, FleetMember]:
    """A supervisor with run "mine" parked: "elsewhere" runs on its lane on ``other``."""
    run_elsewhere(other, "elsewhere", "c1")
    running = await start(fleet_config(tmp_path, member_url, lease=lease))
    fleet = fleet_of(running)
    answer = await running.client.post(
        "/v1/runs", json={"id": "mine", "provider": "demo", "prompt": "x", "conversation": "c1"}
    )
    assert answer.status_code in (200, 201), answer.text
    await wait_parked(running, "mine")
    return running, fleet


async def test_a_run_whose_lane_runs_on_another_member_waits_parked_then_runs(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str, other: FleetStore
) -> None:
    running, _ = await parked_behind_another_member(start, tmp_path, member_url, other)
    # Refused (its lane is busy on the other member), it is parked, not retried in a loop...
    assert status_of(other, "mine") is RunStatus.QUEUED
    calls_before = running.supervisor.ledger.calls
    await trio.sleep(2)
    # Per second: a poll, the claim it lets through, a renewal. A busy loop: hundreds.
    assert running.supervisor.ledger.calls - calls_before <= 8
    # ... and runs once the other member's run has finished.
    other.finish("elsewhere", RunEnd(RunStatus.SUCCEEDED, exit_code=0), time.time())
    body = await running.wait("mine")
    assert body["status"] == "succeeded", body
    final = other.get("mine")
    assert final is not None
    assert final.attempts == 1
    running.supervisor.request_shutdown()
    await running.stopped.wait()
    assert running.supervisor.report is not None
    assert running.supervisor.report.fatal is None
    # A clean stop ends the lease at once: the next expiry removes the member.
    other.expire_lapsed(time.time())
    assert [m.id for m in other.members()] == [other.member_id]


async def submit(running: Running, run_id: str, conversation: str) -> None:
    answer = await running.client.post(
        "/v1/runs",
        json={"id": run_id, "provider": "demo", "prompt": "x", "conversation": conversation},
    )
    assert answer.status_code == 201, answer.text


async def test_a_parked_run_frees_its_slot_at_once_for_a_run_on_a_free_lane(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    run_elsewhere(other, "elsewhere", "c1")
    # One slot, and a poll so long that a run waiting for the next one would
    # miss the test's bound: before parked runs were held without a slot,
    # "free" waited a whole poll behind "mine".
    config = fleet_config(tmp_path, member_url, lease="90s", poll="30s", concurrency=1)
    running = await start(config)
    await submit(running, "mine", "c1")
    await wait_parked(running, "mine")
    status = (await running.client.get("/v1/status")).json()
    assert (status["running"], status["queued"], status["parked"]) == (0, 0, 1), status
    assert status["parked_by_provider"] == {"demo": 1}
    assert status_cli._counts_line(status).startswith("running: 0   queued: 0   parked: 1")
    none_parked = {**status, "parked": 0, "oldest_queued_age": None}
    assert status_cli._counts_line(none_parked) == "running: 0   queued: 0"
    await submit(running, "behind", "c1")  # behind "mine" on its lane
    await submit(running, "free", "c2")
    with trio.fail_after(10):  # a third of the poll
        body = await running.wait("free", seconds=10)
    assert body["status"] == "succeeded", body
    # "mine" still holds its lane here: "behind" was never offered, let alone claimed.
    assert parked(running) == ["mine"]
    assert status_of(other, "behind") is RunStatus.QUEUED
    assert running.supervisor.run_state("behind") is RunState.QUEUED
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_fleet_cap_refusal_closes_its_provider_until_the_next_poll(
    start: Start,
    tmp_path: Path,
    member_url: str,
    monkeypatch: pytest.MonkeyPatch,
    other: FleetStore,
) -> None:
    run_elsewhere(other, "early", "c0")  # the fleet's one demo slot
    more = "provider_caps = { demo = 1 }\n"
    running = await start(fleet_config(tmp_path, member_url, more=more, concurrency=1))
    store = fleet_of(running).store
    claims: list[list[str]] = []
    polls: list[int] = []
    claim_many, poll = store.claim_many, store.poll

    def counting_claim(items: list[tuple[str, str | None]], *args: Any, **kw: Any) -> Any:
        claims.append([run_id for run_id, _ in items])
        return claim_many(items, *args, **kw)

    def counting_poll(cursor: int, *args: Any) -> Any:
        polls.append(cursor)
        return poll(cursor, *args)

    monkeypatch.setattr(store, "claim_many", counting_claim)
    monkeypatch.setattr(store, "poll", counting_poll)
    for n in range(4):  # four lanes, each free: only the fleet's cap says no
        other.submit(NewRun(id=f"r{n}", provider="demo", prompt="p", conversation=f"c{n + 1}"), 3)
    with trio.fail_after(10):
        while len(polls) < 4:
            await trio.sleep(0.05)
    # Each poll offers the first run again and is refused once; without the
    # provider closed, its freed slot went to the next run, and the next:
    # four claims per poll.
    assert claims, "nothing was claimed"
    assert len(claims) <= len(polls), (claims, polls)
    assert all(ids == ["r0"] for ids in claims), claims
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_cancelling_a_parked_run_withdraws_it(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    running, _ = await parked_behind_another_member(start, tmp_path, member_url, other)
    cancelled = await running.client.post("/v1/runs/mine/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert parked(running) == []
    assert status_of(other, "mine") is RunStatus.CANCELLED
    # Its lane frees on the other member: nothing of it is left to start here.
    other.finish("elsewhere", RunEnd(RunStatus.SUCCEEDED, exit_code=0), time.time())
    await trio.sleep(1.5)
    assert status_of(other, "mine") is RunStatus.CANCELLED
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_cancel_arriving_while_a_claim_is_on_its_way_withdraws_the_refused_run(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str, other: FleetStore
) -> None:
    # A long lease: no renewal (which takes the fleet lock too) while the test holds it.
    running, _ = await parked_behind_another_member(start, tmp_path, member_url, other, lease="30s")
    answers: list[httpx.Response] = []
    with psycopg.connect(postgres_url) as conn:
        # Hold the fleet lock: the next claim of "mine" waits for it.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (other._fleet_lock,))
        with trio.fail_after(10):  # the next poll puts it back; its claim starts
            while running.supervisor.run_state("mine") is not RunState.RUNNING:
                await trio.sleep(0.02)
        async with trio.open_nursery() as nursery:

            async def cancel() -> None:
                answers.append(await running.client.post("/v1/runs/mine/cancel"))

            nursery.start_soon(cancel)
            await stop_asked(running, "mine")  # the cancel now waits behind the claim
            conn.rollback()  # the claim goes on, and is refused: the lane is busy
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "cancelled"
    assert status_of(other, "mine") is RunStatus.CANCELLED
    assert parked(running) == []
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def play_holder(other: FleetStore, count: int) -> None:
    """Do what the member holding runs does with cancels asked of it: record them cancelled."""
    done: set[str] = set()
    with trio.fail_after(20):
        while len(done) < count:
            for run_id, reason in other.poll(0).cancels:
                if run_id not in done:
                    other.finish(run_id, RunEnd(RunStatus.CANCELLED, reason=reason), time.time())
                    done.add(run_id)
            await trio.sleep(0.1)


async def test_a_run_another_member_holds_is_cancelled_through_this_member(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    run_elsewhere(other, "early", "c1")  # running there before this member starts
    # The fleet-wide cap (one demo run) holds this member back, not the other.
    more = "provider_caps = { demo = 1 }\n"
    running = await start(fleet_config(tmp_path, member_url, more=more))
    # Seen queued here first (and refused: the cap), then claimed there.
    other.submit(NewRun(id="late", provider="demo", prompt="p", conversation="c2"), 3.0)
    await wait_parked(running, "late")
    assert [r.id for r in other.claim_many([("late", None)], 4.0).claimed] == ["late"]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(play_holder, other, 2)
        for run_id in ("early", "late"):
            answer = await running.client.post(f"/v1/runs/{run_id}/cancel")
            # As a local cancel of a running run: answered once it has ended.
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert (body["status"], body["reason"]) == ("cancelled", "cancel requested")
    # Asked again once ended: as for any ended run.
    again = await running.client.post("/v1/runs/early/cancel")
    assert again.status_code == 409, again.text
    assert again.json()["error"] == "run early already ended as cancelled"
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_cancel_the_holder_has_not_carried_out_in_time_is_answered_202(
    start: Start,
    tmp_path: Path,
    member_url: str,
    other: FleetStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app, "CANCEL_WAIT", 1.5)
    run_elsewhere(other, "held", "c1")
    running = await start(fleet_config(tmp_path, member_url))
    for _ in range(2):  # idempotent: asked twice, one request
        answer = await running.client.post("/v1/runs/held/cancel")
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "running"
    assert other.poll(0).cancels == [("held", "cancel requested")]
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_cancel_asked_through_another_member_stops_the_run_here(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str, other: FleetStore
) -> None:
    running = await start(fleet_config(tmp_path, member_url, delay=60))
    answer = await running.client.post(
        "/v1/runs", json={"id": "long", "provider": "demo", "prompt": "x", "conversation": "c1"}
    )
    assert answer.status_code == 201, answer.text
    with trio.fail_after(10):
        while not (agents := processes_with_env("HERDSMAN_RUN_ID=long", tmp_path)):
            await trio.sleep(0.05)
    record, _ = other.request_cancel("long", time.time(), "stopped from the other member")
    assert record.status is RunStatus.RUNNING
    body = await running.wait("long")
    assert (body["status"], body["reason"]) == ("cancelled", "stopped from the other member")
    assert not any(process_alive(pid) for pid in agents)
    with psycopg.connect(postgres_url) as conn:  # recorded by the member that held it
        row = conn.execute("SELECT held_by FROM runs WHERE id = 'long'").fetchone()
    assert row == (fleet_of(running).store.member_id,)
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_status_shows_every_member_of_the_fleet(
    start: Start,
    tmp_path: Path,
    member_url: str,
    other: FleetStore,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_elsewhere(other, "elsewhere", "c1")
    running = await start(fleet_config(tmp_path, member_url, delay=60))
    answer = await running.client.post(
        "/v1/runs", json={"id": "here", "provider": "demo", "prompt": "x", "conversation": "c2"}
    )
    assert answer.status_code == 201, answer.text
    await wait_running(running, "here")
    fleet = (await running.client.get("/v1/status")).json()["fleet"]
    this = fleet_of(running).store.member_id
    assert fleet["member_id"] == this
    assert (fleet["running"], fleet["running_unheld"]) == (2, 0)
    by_id = {m["id"]: m for m in fleet["members"]}
    assert set(by_id) == {this, other.member_id}
    mine, theirs = by_id[this], by_id[other.member_id]
    assert (mine["this"], mine["pid"], mine["running"]) == (True, os.getpid(), 1)
    assert mine["running_by_provider"] == {"demo": 1}
    assert (theirs["this"], theirs["host"], theirs["running"]) == (False, "other", 1)
    assert 0 < mine["lease_left"] <= 3  # this member's lease: 3 s
    assert 50 < theirs["lease_left"] <= 60
    status_cli._print_fleet(fleet)
    table = capsys.readouterr().out
    assert "fleet: 2 member(s), 2 running" in table
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()[3:]}
    assert rows[this][:2] == ["(this", "one)"]
    assert rows[other.member_id][0] == "other:1"
    running.supervisor.request_shutdown()
    running.supervisor.request_shutdown()  # a second time: "here" is cancelled, not awaited
    await running.stopped.wait()


async def wait_running(running: Running, run_id: str) -> None:
    with trio.fail_after(10):
        while (await running.client.get(f"/v1/runs/{run_id}")).json()["status"] != "running":
            await trio.sleep(0.05)


async def test_a_run_another_member_requeued_runs_here_in_its_place(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str, other: FleetStore
) -> None:
    """Re-queued after a usage limit by a member that then left: this one runs it, first."""
    run_elsewhere(other, "limited", "c1")  # running there before this member starts
    running = await start(fleet_config(tmp_path, member_url, delay=0.5))
    fleet = fleet_of(running)
    # Polled here: "seen" moves the cursor past "limited"; "after" waits behind it.
    for run_id, conversation in (("seen", "c2"), ("after", "c1")):
        answer = await running.client.post(
            "/v1/runs",
            json={"id": run_id, "provider": "demo", "prompt": "x", "conversation": conversation},
        )
        assert answer.status_code == 201, answer.text
    assert (await running.wait("seen"))["status"] == "succeeded"
    limited = other.get("limited")
    assert limited is not None
    assert fleet.cursor > limited.seq
    assert status_of(other, "after") is RunStatus.QUEUED  # parked: its lane runs there
    # The other member's run stops at a usage limit; it re-queues it and leaves.
    other.finish("limited", RunEnd(RunStatus.USAGE_LIMITED, reason="limit"), time.time())
    other.requeue("limited")
    other.leave()
    first = await running.wait("limited")
    second = await running.wait("after")
    assert (first["status"], first["attempts"]) == ("succeeded", 2)
    assert second["status"] == "succeeded"
    assert first["finished_at"] <= second["started_at"]  # FIFO on c1: it went first
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT held_by FROM runs WHERE id = 'limited'").fetchone()
    assert row == (fleet.store.member_id,)
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_lapsed_lease_stops_admitting_and_stops_the_supervisor(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str
) -> None:
    running = await start(fleet_config(tmp_path, member_url))
    fleet = fleet_of(running)
    # As if the supervisor had been stopped (a frozen VM) longer than its lease.
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE supervisors SET lease_until = 0 WHERE id = %s", (fleet.store.member_id,)
        )
    with trio.fail_after(10):
        await running.stopped.wait()
    report = running.supervisor.report
    assert report is not None
    assert report.fatal is not None
    assert "lease" in report.fatal
    assert "has expired" in report.fatal
    assert not running.supervisor.admitting


async def test_a_lapsed_lease_stops_the_member_s_running_runs_at_once(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str
) -> None:
    # A drain would let the run go on: its conversation may be run elsewhere
    # once its run is declared lost (docs/fleet.md, fencing).
    running = await start(fleet_config(tmp_path, member_url, delay=60))
    fleet = fleet_of(running)
    answer = await running.client.post(
        "/v1/runs", json={"id": "long", "provider": "demo", "prompt": "x"}
    )
    assert answer.status_code == 201, answer.text
    with trio.fail_after(10):
        while status_of(fleet.store, "long") is not RunStatus.RUNNING:
            await trio.sleep(0.02)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE supervisors SET lease_until = 0 WHERE id = %s", (fleet.store.member_id,)
        )
    with trio.fail_after(20):
        await running.stopped.wait()
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT status, reason FROM runs WHERE id = 'long'").fetchone()
    # Stopped by the member itself, at its next renewal: not by its fence
    # keeper's SIGKILL at the deadline, nor at the end of a 60 s agent.
    assert row == ("cancelled", "this fleet member's lease ran out")


async def test_a_member_whose_fence_keeper_dies_stops(
    start: Start, tmp_path: Path, member_url: str
) -> None:
    # Without its keeper, nothing would kill its agents should it die or hang.
    running = await start(fleet_config(tmp_path, member_url))
    fence = fleet_of(running).fence
    assert fence is not None
    os.kill(fence.pid, signal.SIGKILL)
    with trio.fail_after(10):
        await running.stopped.wait()
    report = running.supervisor.report
    assert report is not None
    assert report.fatal is not None
    assert f"the fence keeper (pid {fence.pid}) exited with status -9" in report.fatal
    assert not running.supervisor.admitting


async def test_a_member_whose_fence_keeper_is_stopped_stops(
    start: Start, tmp_path: Path, member_url: str
) -> None:
    # A stopped keeper kills nothing: as good as dead.
    running = await start(fleet_config(tmp_path, member_url))
    fence = fleet_of(running).fence
    assert fence is not None
    os.kill(fence.pid, signal.SIGSTOP)
    try:
        with trio.fail_after(10):
            await running.stopped.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):  # never left stopped
            os.kill(fence.pid, signal.SIGCONT)
    report = running.supervisor.report
    assert report is not None
    assert report.fatal is not None
    assert f"the fence keeper (pid {fence.pid}) is stopped" in report.fatal
    assert not running.supervisor.admitting


async def test_a_reload_changes_the_lease_the_next_renewal_asks_for(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str
) -> None:
    path = fleet_config(tmp_path, member_url, lease="3s")
    running = await start(path)
    fleet = fleet_of(running)
    path.write_text(path.read_text().replace('lease = "3s"', 'lease = "9s"'))
    answer = await running.client.post("/v1/reload")
    assert answer.status_code == 200, answer.text
    changes = {c["key"]: c for c in answer.json()["changes"]}
    assert changes["fleet.lease"]["applied"] is True
    # The lease as the server holds it, once a renewal has committed: more
    # than 3 s left can only come from a renewal that asked for the new
    # lease. (The member's own ``lease`` changes before its renewal commits.)
    left = partial(lease_left, postgres_url, fleet.store.member_id)
    with trio.fail_after(10):  # renewed every lease/3 = 1 s
        while (seconds := await trio.to_thread.run_sync(left)) <= 3:
            await trio.sleep(0.05)
    assert seconds <= 9
    assert fleet.store.lease == 9
    assert not running.stopped.is_set()
    running.supervisor.request_shutdown()
    await running.stopped.wait()


def test_the_claim_rules_come_from_the_fleet_table(tmp_path: Path) -> None:
    text = """\
[providers.claude]
exec = ["claude"]
[[providers.claude.accounts]]
name = "work"
[scheduling]
agent_exclusive = false
[store]
url = "postgresql://db.example/herdsman"
[fleet]
enabled = true
provider_caps = { claude = 3 }
account_caps = { claude = { work = 2 } }
"""
    config = load_config_text(text, tmp_path / "supervisor.toml", environ={}).config
    assert FleetMember.rules(config) == ClaimRules(
        agent_exclusive=False, provider_caps={"claude": 3}, account_caps={("claude", "work"): 2}
    )


async def test_a_run_sharing_a_conversation_with_a_left_agent_starts_once_it_is_stopped(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    # An agent of "old" (conversation c1), left under this member's state
    # directory, that ignores SIGTERM: stopping it takes the whole grace.
    run_elsewhere(other, "old", "c1")
    env = {
        **os.environ,
        "HERDSMAN_RUN_ID": "old",
        "HERDSMAN_STATE_DIR": str(tmp_path / "state"),
    }
    script = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    agent = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    try:
        while b"HERDSMAN_RUN_ID" not in Path(f"/proc/{agent.pid}/environ").read_bytes():
            await trio.sleep(0.01)
        running = await start(fleet_config(tmp_path, member_url))
        # "old" ends: its lane is free fleet-wide, so "mine" is claimed at once.
        other.finish("old", RunEnd(RunStatus.SUCCEEDED, exit_code=0), time.time())
        answer = await running.client.post(
            "/v1/runs",
            json={"id": "mine", "provider": "demo", "prompt": "x", "conversation": "c1"},
        )
        assert answer.status_code == 201, answer.text
        await trio.to_thread.run_sync(agent.wait)  # reaped the moment it is killed
        stopped_at = time.time()
        body = await running.wait("mine")
        assert body["status"] == "succeeded", body
        # Its agent was spawned (its log made) only after the left agent was gone.
        spawned_at = (tmp_path / "state" / "logs" / "mine.log").stat().st_mtime
        assert spawned_at >= stopped_at - 0.1
        running.supervisor.request_shutdown()
        await running.stopped.wait()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()


async def test_a_skip_submit_counts_runs_queued_or_running_on_other_members(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    # A long poll: nothing of the other member's is polled until a submit here.
    running = await start(fleet_config(tmp_path, member_url, lease="60s", poll="30s"))
    run_elsewhere(other, "running-there", "c1")
    queued = NewRun(id="queued-there", provider="demo", prompt="p", conversation="c2", agent="a1")
    other.submit(queued, 3.0)
    assert running.supervisor.run_state("queued-there") is None  # not polled yet

    async def submit(run_id: str, conversation: str, agent: str | None = None) -> str:
        body = {"id": run_id, "provider": "demo", "prompt": "x", "conversation": conversation}
        answer = await running.client.post(
            "/v1/runs", json={**body, "agent": agent, "on_busy": "skip"}
        )
        assert answer.status_code == 201, answer.text
        status: str = answer.json()["status"]
        return status

    # Its conversation runs on the other member; queued there; its agent queued there.
    assert await submit("same-conversation", "c1") == "skipped"
    assert await submit("behind-queued", "c2") == "skipped"
    assert await submit("same-agent", "c3", "a1") == "skipped"
    # A free conversation and agent is queued, and runs.
    assert await submit("free", "c4", "a2") == "queued"
    body = await running.wait("free")
    assert body["status"] == "succeeded", body
    skipped = other.get("same-agent")
    assert skipped is not None
    assert skipped.reason == SKIP_REASON
    running.supervisor.request_shutdown()
    await running.stopped.wait()


def repos_config(directory: Path, url: str, *, poll: str = "1s") -> Path:
    repo = git_repository(directory / "repo")
    more = f'[[repos]]\nname = "app"\npath = "{repo}"\n[retention]\nidle = "0s"\n'
    return fleet_config(directory, url, lease="60s", poll=poll, more=more)


async def test_a_polled_run_waits_for_a_removal_of_its_conversation_s_worktrees(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    running = await start(repos_config(tmp_path, member_url))
    supervisor = running.supervisor
    assert supervisor.worktrees is not None
    with supervisor.worktrees.removing("default", "c"):  # a sweep's removal under way
        for run_id, conversation in (("r0", None), ("r1", "c"), ("r2", None)):
            new = NewRun(id=run_id, provider="demo", prompt="p", conversation=conversation)
            other.submit(new, time.time())
        # Polled: r0 runs; r1 waits for the removal, and r2, after it in the
        # fleet's order, with it.
        assert (await running.wait("r0"))["status"] == "succeeded"
        assert supervisor.run_state("r1") is None
        assert supervisor.run_state("r2") is None
        # Claimed meanwhile, so the sweep removes nothing more of c.
        assert supervisor.conversation_busy("default", "c")
        released_at = time.time()
    for run_id in ("r1", "r2"):
        body = await running.wait(run_id)
        assert body["status"] == "succeeded", body
        assert body["started_at"] >= released_at
    assert not supervisor.conversation_busy("default", "c")
    supervisor.request_shutdown()
    await running.stopped.wait()


async def test_the_sweep_keeps_worktrees_of_conversations_live_on_other_members(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    # A long poll: the run queued on the other member is not polled here.
    running = await start(repos_config(tmp_path, member_url, poll="30s"))
    supervisor = running.supervisor
    for conversation in ("c", "d", "e"):
        body = {"id": f"here-{conversation}", "provider": "demo", "prompt": "x"}
        answer = await running.client.post("/v1/runs", json={**body, "conversation": conversation})
        assert answer.status_code == 201, answer.text
        assert (await running.wait(f"here-{conversation}"))["status"] == "succeeded"
    run_elsewhere(other, "running-there", "c")  # running on the other member
    other.submit(NewRun(id="queued-there", provider="demo", prompt="p", conversation="d"), 5.0)

    def actions(report: SweepReport) -> dict[str, str]:
        return {entry.conversation: entry.action for entry in report.entries}

    report = await supervisor.sweep_worktrees()
    assert actions(report) == {"c": "busy", "d": "busy", "e": "removed"}
    other.finish("running-there", RunEnd(RunStatus.SUCCEEDED, exit_code=0), time.time())
    other.cancel_queued("queued-there", time.time(), "test")
    assert actions(await supervisor.sweep_worktrees()) == {"c": "removed", "d": "removed"}
    supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_finish_the_ledger_refuses_is_recorded_again_its_lanes_held_meanwhile(
    *,
    start: Start,
    tmp_path: Path,
    member_url: str,
    other: FleetStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Left unrecorded, the run would stay running in the ledger, its lanes
    # held fleet-wide, for as long as this member renews its lease.
    caplog.set_level(logging.INFO, logger="herdsman.supervisor")
    refusals = 3
    real_finish = FleetStore.finish

    def flaky(self: FleetStore, *args: Any, **kwargs: Any) -> RunRecord:
        nonlocal refusals
        if refusals > 0:
            refusals -= 1
            raise StoreError("the server went away")
        return real_finish(self, *args, **kwargs)

    monkeypatch.setattr(FleetStore, "finish", flaky)
    running = await start(fleet_config(tmp_path, member_url))
    for run_id in ("r1", "r2"):
        body = {"id": run_id, "provider": "demo", "prompt": "x", "conversation": "c"}
        answer = await running.client.post("/v1/runs", json=body)
        assert answer.status_code == 201, answer.text
    assert await unrecorded_finish(caplog, "r1") == (
        "could not record how run r1 ended (succeeded): the server went away; trying again"
        " until the ledger records it; its lanes stay held meanwhile"
    )
    # While r1's finish is retried, its conversation's next run waits.
    r2 = other.get("r2")
    assert r2 is not None
    assert r2.status is RunStatus.QUEUED
    with trio.fail_after(20):
        assert (await running.supervisor.wait("r2", 20)).status is RunStatus.SUCCEEDED
    r1, r2 = other.get("r1"), other.get("r2")
    assert r1 is not None
    assert r2 is not None
    assert r1.status is RunStatus.SUCCEEDED
    assert r1.finished_at is not None
    assert r2.started_at is not None
    assert r1.finished_at <= r2.started_at
    assert refusals == 0
    assert "run r1: its finish is recorded at last" in caplog.text
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_finish_the_ledger_keeps_refusing_is_given_up_at_a_forced_stop(
    *,
    start: Start,
    tmp_path: Path,
    member_url: str,
    other: FleetStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise StoreError("the server went away")

    running = await start(fleet_config(tmp_path, member_url))
    monkeypatch.setattr(FleetStore, "finish", refuse)
    answer = await running.client.post(
        "/v1/runs", json={"id": "r1", "provider": "demo", "prompt": "x"}
    )
    assert answer.status_code == 201, answer.text
    await unrecorded_finish(caplog, "r1")
    # A drain waits for the finish (the ledger may come back); a forced stop
    # gives up on it, and says what becomes of the run.
    running.supervisor.request_shutdown()
    running.supervisor.request_shutdown()
    with trio.fail_after(30):
        await running.stopped.wait()
    line = "could not record how run r1"
    gave_up = [r.getMessage() for r in caplog.records if line in r.getMessage()]
    assert gave_up[-1] == (
        "could not record how run r1 ended (succeeded): the server went away; it stays running"
        " in the ledger, its lanes held fleet-wide, until this member's lease ends; the expiry"
        " after that reports it lost"
    )
    # True: running, held by the member, until its lease ends (a clean stop
    # ends it) and an expiry records it lost.
    assert other.held_by("r1") == fleet_of(running).store.member_id
    monkeypatch.undo()
    [lost] = other.expire_lapsed(time.time())
    assert (lost.id, lost.status) == ("r1", RunStatus.LOST)


# -- races with other members: cancels, runs that leave the queue elsewhere --------


async def late_parked_by_the_cap(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> Running:
    """A supervisor with run "late" parked: "early" on ``other`` fills a fleet-wide cap of 1."""
    run_elsewhere(other, "early", "c1")
    more = "provider_caps = { demo = 1 }\n"
    running = await start(fleet_config(tmp_path, member_url, lease="30s", more=more))
    other.submit(NewRun(id="late", provider="demo", prompt="p", conversation="c2"), 3.0)
    await wait_parked(running, "late")
    return running


async def claim_held_back(
    running: Running, postgres_url: str, lock: int
) -> psycopg.Connection[Any]:
    """Hold the fleet lock until this member's claim of "late" waits for it; the caller releases."""
    conn = psycopg.connect(postgres_url)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
    with trio.fail_after(10):  # the next poll un-parks it; its claim waits for the lock
        while running.supervisor.run_state("late") is not RunState.RUNNING:
            await trio.sleep(0.02)
    return conn


async def test_a_cancel_whose_claim_here_finds_the_run_claimed_elsewhere_asks_its_holder(
    *,
    start: Start,
    tmp_path: Path,
    member_url: str,
    postgres_url: str,
    other: FleetStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app, "CANCEL_WAIT", 1.0)
    running = await late_parked_by_the_cap(start, tmp_path, member_url, other)
    # The other member (no cap of its own) claims it: it runs there now.
    assert [r.id for r in other.claim_many([("late", None)], 4.0).claimed] == ["late"]
    assert other._fleet_lock is not None
    conn = await claim_held_back(running, postgres_url, other._fleet_lock)
    answers: list[httpx.Response] = []
    with conn:
        async with trio.open_nursery() as nursery:

            async def cancel() -> None:
                answers.append(await running.client.post("/v1/runs/late/cancel"))

            nursery.start_soon(cancel)
            await stop_asked(running, "late")  # the cancel waits behind the claim in the ledger
            conn.rollback()  # the claim goes on: refused as gone, held by "other"
    [answer] = answers
    # Not 409: the run runs on the other member, which is asked to cancel it.
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "running"
    assert other.poll(0).cancels == [("late", "cancel requested")]
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_cancel_whose_refused_claim_meets_a_claim_elsewhere_asks_its_holder(
    *,
    start: Start,
    tmp_path: Path,
    member_url: str,
    postgres_url: str,
    other: FleetStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app, "CANCEL_WAIT", 1.0)
    running = await late_parked_by_the_cap(start, tmp_path, member_url, other)
    assert other._fleet_lock is not None
    conn = await claim_held_back(running, postgres_url, other._fleet_lock)
    claimed: list[list[RunRecord]] = []
    answers: list[httpx.Response] = []
    with conn:

        def claim_there() -> None:
            claimed.append(other.claim_many([("late", None)], time.time()).claimed)

        async with trio.open_nursery() as nursery:

            async def cancel() -> None:
                answers.append(await running.client.post("/v1/runs/late/cancel"))

            async def claim() -> None:
                await trio.to_thread.run_sync(claim_there)

            nursery.start_soon(cancel)
            await stop_asked(running, "late")  # the cancel waits behind the claim here
            nursery.start_soon(claim)  # and the other member's claim behind it
            waiting = fleet_lock_waiters(other._fleet_lock)
            with psycopg.connect(postgres_url) as watch, trio.fail_after(10):
                # Both claims wait for the lock (this member's came first).
                while watch.execute(waiting).fetchone() != (2,):
                    await trio.sleep(0.05)
            # The claim here is refused (the cap), the other member's takes the
            # run, and only then does this member's cancel of it reach the ledger.
            conn.rollback()
    [answer] = answers
    assert [r.id for r in claimed[0]] == ["late"]
    assert answer.status_code == 202, answer.text  # not 500
    assert status_of(other, "late") is RunStatus.RUNNING
    assert other.poll(0).cancels == [("late", "cancel requested")]
    assert parked(running) == []
    assert running.supervisor.run_state("late") is None
    running.supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_run_cancelled_elsewhere_leaves_this_member_s_queue_at_its_next_poll(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    running = await start(fleet_config(tmp_path, member_url, lease="30s", delay=60, concurrency=1))
    supervisor = running.supervisor

    async def submit(run_id: str, conversation: str, on_busy: str = "queue") -> str:
        body = {"id": run_id, "provider": "demo", "prompt": "x", "conversation": conversation}
        answer = await running.client.post("/v1/runs", json={**body, "on_busy": on_busy})
        assert answer.status_code == 201, answer.text
        status: str = answer.json()["status"]
        return status

    assert await submit("long", "c0") == "queued"  # this member's only demo slot
    await wait_running(running, "long")
    assert await submit("x", "c1") == "queued"  # waits here for the slot
    with trio.fail_after(10):
        while supervisor.run_state("x") is None:
            await trio.sleep(0.05)
    # Cancelled through another member: never offered here, so no claim says so.
    _, cancelled = other.request_cancel("x", time.time(), "cancelled elsewhere")
    assert cancelled
    with trio.fail_after(5):
        while supervisor.run_state("x") is not None:
            await trio.sleep(0.05)
    assert supervisor.status()["queued"] == 0
    # Nothing of c1 is queued or running in the fleet: a skip-submit is queued.
    assert await submit("follow-up", "c1", on_busy="skip") == "queued"
    assert status_of(other, "x") is RunStatus.CANCELLED  # withdrawn, not recorded again
    supervisor.request_shutdown()
    supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_run_of_a_provider_this_member_lacks_leaves_its_queue_once_run_elsewhere(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    running = await start(fleet_config(tmp_path, member_url, lease="30s"))
    supervisor = running.supervisor
    # A run for a provider only the other member has: never offered here.
    other.submit(NewRun(id="theirs", provider="claude", prompt="p", conversation="c1"), 1.0)
    with trio.fail_after(10):
        while supervisor.run_state("theirs") is None:
            await trio.sleep(0.05)
    assert [r.id for r in other.claim_many([("theirs", None)], time.time()).claimed] == ["theirs"]
    other.finish("theirs", RunEnd(RunStatus.SUCCEEDED, exit_code=0), time.time())
    body = {"id": "mine", "provider": "demo", "prompt": "x", "conversation": "c1"}
    assert (await running.client.post("/v1/runs", json=body)).status_code == 201
    # Its lane is free fleet-wide: it runs here, "theirs" no longer ahead of it.
    assert (await running.wait("mine", 10))["status"] == "succeeded"
    assert supervisor.run_state("theirs") is None
    supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_run_pruned_after_it_was_cancelled_elsewhere_does_not_stop_this_member(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    running = await start(fleet_config(tmp_path, member_url, lease="30s", delay=3, concurrency=1))
    supervisor = running.supervisor
    for run_id, conversation in (("long", "c0"), ("x", "c1")):
        body = {"id": run_id, "provider": "demo", "prompt": "x", "conversation": conversation}
        assert (await running.client.post("/v1/runs", json=body)).status_code == 201
    with trio.fail_after(10):
        while supervisor.run_state("x") is None:
            await trio.sleep(0.05)
    other.request_cancel("x", time.time(), "cancelled elsewhere")
    assert other.prune(time.time() + 1) == 1  # "x" is gone from the ledger
    assert (await running.wait("long"))["status"] == "succeeded"
    body = {"id": "after", "provider": "demo", "prompt": "x", "conversation": "c1"}
    assert (await running.client.post("/v1/runs", json=body)).status_code == 201
    assert (await running.wait("after"))["status"] == "succeeded"
    assert supervisor.fatal is None
    assert not running.stopped.is_set()
    supervisor.request_shutdown()
    await running.stopped.wait()


async def test_runs_held_back_for_a_removal_are_queued_only_if_still_queued(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    # A long poll: after the removal, only the re-read decides what is queued here.
    running = await start(repos_config(tmp_path, member_url, poll="30s"))
    supervisor = running.supervisor
    assert supervisor.worktrees is not None
    with supervisor.worktrees.removing("default", "c"):
        # r1 and r2 of a provider only the other member has: never offered here,
        # so no claim of theirs would find them gone.
        for run_id, conversation, provider in (
            ("r1", "c", "claude"),
            ("r2", "d", "claude"),
            ("r3", "e", "demo"),
        ):
            new = NewRun(id=run_id, provider=provider, prompt="p", conversation=conversation)
            other.submit(new, time.time())
        fleet_of(running).poke()
        with trio.fail_after(10):  # polled, and held back behind the removal
            while not supervisor.conversation_busy("default", "c"):
                await trio.sleep(0.02)
        assert supervisor.run_state("r1") is None
        other.cancel_queued("r1", time.time(), "test")  # cancelled elsewhere meanwhile
        assert [r.id for r in other.claim_many([("r2", None)], time.time()).claimed] == ["r2"]
    assert (await running.wait("r3"))["status"] == "succeeded"
    assert supervisor.run_state("r1") is None
    assert supervisor.run_state("r2") is None
    assert supervisor.status()["queued"] == 0
    assert status_of(other, "r2") is RunStatus.RUNNING  # the other member's to finish
    supervisor.request_shutdown()
    await running.stopped.wait()


async def test_a_usage_limit_that_meets_a_cancel_asked_elsewhere_ends_the_run_cancelled(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str, other: FleetStore
) -> None:
    block = provider_block(tmp_path, "claude-event", [("work", "")])
    # The agent takes 2 s before it reports the limit: time to hold the fleet lock.
    block = block.replace(
        f'exec = ["{sys.executable}", ',
        f"""exec = ["sh", "-c", 'sleep 2; exec "$0" "$@"', "{sys.executable}", """,
    )
    limit(tmp_path, "work", resets_in=3600)
    # A lease of an hour: renewed at the start only. A renewal takes the fleet
    # lock too; one waiting for it below would pass for the finish, and the
    # cancel, committed early, would reach the member's poll while the agent
    # still ran and end the run by the plain cancel path instead.
    fleet = f'[store]\nurl = "{member_url}"\n[fleet]\nenabled = true\nlease = "1h"\npoll = "1s"\n'
    running = await start(write_config(tmp_path, extra=fleet + block))
    supervisor = running.supervisor
    body = {"id": "r", "provider": "agent", "prompt": "x", "conversation": "c1"}
    assert (await running.client.post("/v1/runs", json=body)).status_code == 201
    await wait_running(running, "r")
    assert other._fleet_lock is not None
    with psycopg.connect(postgres_url) as conn, psycopg.connect(postgres_url) as watch:
        # The cancel is asked (as request_cancel does) while the agent runs, and
        # becomes visible only as its usage-limited finish waits for the lock.
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (other._fleet_lock,))
        conn.execute("UPDATE runs SET cancel_request = 'stop it' WHERE id = 'r'")
        waiting = fleet_lock_waiters(other._fleet_lock)
        with trio.fail_after(10):
            while watch.execute(waiting).fetchone() == (0,):
                await trio.sleep(0.05)
        conn.commit()
    with trio.fail_after(10):
        while status_of(other, "r") is RunStatus.RUNNING:
            await trio.sleep(0.05)
    record = other.get("r")
    assert record is not None
    assert (record.status, record.reason, record.attempts) == (RunStatus.CANCELLED, "stop it", 1)
    assert record.notes[-1].endswith("cancelled as asked")
    # Not queued again here either: the next run of its conversation runs.
    # (The ledger shows the finish a moment before this member has handled
    # its commit: other reads it from the database, not through the member.)
    with trio.fail_after(5):
        while supervisor.run_state("r") is not None:
            await trio.sleep(0.01)
    body = {"id": "next", "provider": "demo", "prompt": "x", "conversation": "c1"}
    assert (await running.client.post("/v1/runs", json=body)).status_code == 201
    assert (await running.wait("next"))["status"] == "succeeded"
    supervisor.request_shutdown()
    await running.stopped.wait()
