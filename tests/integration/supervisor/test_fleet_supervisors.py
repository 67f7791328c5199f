"""Several `herdsman run` processes as one fleet on a real PostgreSQL server.

Real processes, real HTTP, the demo agent: runs are submitted to every
member, on hot conversations and shared agents, and the ledger and the
traces must show the fleet's rules held (docs/fleet.md); then one member is
killed with SIGKILL while it runs runs.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import CLI, Supervisor, herdsman, process_alive, processes_with_env
from fleet_support import client, fleet_toml
from supervisor_support import write_config

from herdsman.runtime.orphans import find_orphans, stopped_note
from herdsman.runtime.store import NewRun, RunRecord, RunStatus
from herdsman.runtime.store.fleet import FleetStore
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.trace import read_trace

RUNS = 40


def start_members(
    tmp_path: Path, url: str, count: int, *, delay: float, lease: str = "3s", first: int = 0
) -> list[Supervisor]:
    """``count`` members in ``member{first}``, ``member{first + 1}``... under ``tmp_path``."""
    members = []
    for n in range(first, first + count):
        directory = tmp_path / f"member{n}"
        directory.mkdir()
        write_config(
            directory,
            concurrency=2,
            delay=delay,
            extra=fleet_toml(url, lease=lease),
        )
        members.append(Supervisor(directory))
    return members


def submit_spread(members: list[Supervisor], count: int, first: int = 0) -> list[str]:
    """Submit runs ``first`` to ``count - 1`` round-robin: 4 hot conversations, 3 agents."""
    clients = [client(member) for member in members]
    ids = []
    try:
        for n in range(first, count):
            body = {
                "id": f"r{n:02}",
                "provider": "demo",
                "prompt": f"prompt {n}",
                "conversation": f"c{n % 4}",
                "agent": f"a{n % 3}",
            }
            answer = clients[(n - first) % len(clients)].post("/v1/runs", json=body)
            assert answer.status_code in (200, 201), answer.text
            ids.append(body["id"])
    finally:
        for each in clients:
            each.close()
    return ids


def wait_until_settled(store: PostgresStore, ids: list[str], timeout: float) -> list[RunRecord]:
    deadline = time.monotonic() + timeout
    while True:
        records = [store.get(run_id) for run_id in ids]
        if all(r is not None and r.status not in (RunStatus.QUEUED, RunStatus.RUNNING)
               for r in records):  # fmt: skip
            return [r for r in records if r is not None]
        assert time.monotonic() < deadline, Counter(r.status for r in records if r is not None)
        time.sleep(0.2)


def trace_starts(members: list[Supervisor]) -> Counter[str]:
    starts: Counter[str] = Counter()
    for member in members:
        for path in (member.directory / "state" / "traces").glob("*.jsonl"):
            _, events = read_trace(path)
            starts.update(e.fields["run_id"] for e in events if e.event == "start")
    return starts


def check_rules(records: list[RunRecord]) -> None:
    """No two runs sharing a key overlapped; per key, runs started in submission order."""
    by_key: dict[str, list[RunRecord]] = {}
    for record in records:
        for key in (f"conversation:{record.conversation}", f"agent:{record.agent}"):
            by_key.setdefault(key, []).append(record)
    for key, runs in by_key.items():
        ran = sorted(runs, key=lambda r: r.seq)
        starts = [r.started_at for r in ran if r.started_at is not None]
        assert len(starts) == len(ran), key
        assert starts == sorted(starts), f"{key}: not started in submission order"
        for before, after in itertools.pairwise(ran):
            assert before.finished_at is not None
            assert after.started_at is not None
            assert before.finished_at <= after.started_at, f"{key}: {before.id} overlaps {after.id}"


def test_three_members_share_one_queue_under_the_rules(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    closing += start_members(tmp_path, fleet_url, 3, delay=0.2)
    ids = submit_spread(closing, RUNS)
    store = PostgresStore(postgres_url)
    try:
        records = wait_until_settled(store, ids, timeout=60)
    finally:
        store.close()
    outputs = "\n".join(member.output() for member in closing)
    assert [r.status for r in records] == [RunStatus.SUCCEEDED] * RUNS, outputs
    assert all(r.attempts == 1 for r in records)
    starts = trace_starts(closing)
    assert starts == Counter(dict.fromkeys(ids, 1))
    check_rules(records)
    # The work was shared: more than one member started runs.
    started_by = [sum(trace_starts([member]).values()) for member in closing]
    assert sum(started_by) == RUNS
    assert sum(1 for n in started_by if n) > 1, started_by
    for member in closing:
        assert member.stop(signal.SIGTERM) == 0, member.output()


@pytest.mark.slow
def test_a_killed_member_s_runs_become_lost_and_the_others_finish_the_queue(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    # The member to be killed runs two runs, alone in the fleet so that no
    # other member wins their claims (which member does is decided by
    # milliseconds), and long ones, so that both still run when it is killed
    # however long that takes on a loaded machine.
    closing += start_members(tmp_path, fleet_url, 1, delay=60)
    victim = closing[0]
    held = submit_spread([victim], 2)
    deadline = time.monotonic() + 30
    while sorted(trace_starts([victim])) != held:
        assert time.monotonic() < deadline, victim.output()
        time.sleep(0.05)
    # Both its slots are taken: it claims nothing more while the others join
    # and the rest of the queue is submitted to all three.
    closing += start_members(tmp_path, fleet_url, 2, delay=1.5, first=1)
    ids = held + submit_spread(closing, 18, first=len(held))
    store = PostgresStore(postgres_url)
    try:
        victim.process.kill()
        victim.process.wait()
        records = wait_until_settled(store, ids, timeout=60)
    finally:
        store.close()
    by_id = {r.id: r for r in records}
    lost = {r.id for r in records if r.status is RunStatus.LOST}
    assert lost == set(held), "the killed member's running runs are recorded lost"
    reason = f"supervisor {socket.gethostname()}:{victim.process.pid} lease expired"
    assert {by_id[run_id].reason for run_id in lost} == {reason}
    assert all(by_id[run_id].attempts == 1 for run_id in lost)
    assert all(by_id[i].status is RunStatus.SUCCEEDED for i in ids if i not in lost)
    # Nothing ran twice: every run started once across all the traces.
    assert trace_starts(closing) == Counter(dict.fromkeys(ids, 1))
    for member in closing[1:]:
        assert member.stop(signal.SIGTERM) == 0, member.output()


def submit_one(member: Supervisor, run_id: str, conversation: str) -> None:
    with client(member) as each:
        body = {"id": run_id, "provider": "demo", "prompt": "x", "conversation": conversation}
        answer = each.post("/v1/runs", json=body)
        assert answer.status_code in (200, 201), answer.text


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_member_killed_and_started_again_stops_its_agents_once_their_runs_are_lost(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    closing += start_members(tmp_path, fleet_url, 1, delay=60)
    victim = closing[0]
    state = victim.directory / "state"
    submit_one(victim, "r0", "c0")
    wait_for(lambda: find_orphans(["r0"], state), 20, "the agent of r0 never started")
    # The member and its fence keeper die together: r0's agent lives on.
    victim.kill_with_its_keeper()
    [groups] = find_orphans(["r0"], state).values()
    # Started again on the same state directory: a new member, which finds the
    # agent, and stops it once the old member's lease lapsed and r0 is lost.
    closing.append(Supervisor(victim.directory))
    restarted = closing[-1]
    wait_for(lambda: not find_orphans(["r0"], state), 30, restarted.output())
    # An exiting process leaves /proc's view of its environment (what
    # find_orphans reads) a moment before it stops running.
    wait_for(lambda: all(not process_alive(group) for group in groups), 10, restarted.output())
    store = PostgresStore(postgres_url)
    try:
        # The note is recorded once the agent is gone.
        wait_for(lambda: (r := store.get("r0")) is not None and r.notes, 10, restarted.output())
        r0 = store.get("r0")
    finally:
        store.close()
    assert r0 is not None
    assert r0.status is RunStatus.LOST
    assert r0.reason == f"supervisor {socket.gethostname()}:{victim.process.pid} lease expired"
    assert r0.notes == (stopped_note(groups),)
    assert "stopping 1 agent process group(s) of lost runs" in restarted.output()
    assert restarted.stop(signal.SIGTERM) == 0, restarted.output()


def test_a_started_member_leaves_alone_an_agent_whose_run_a_live_member_holds(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    state = tmp_path / "member0" / "state"
    other = FleetStore(postgres_url, member_id="other", host="other", pid=1, lease=60)
    try:
        other.submit(NewRun(id="r0", provider="demo", prompt="p", conversation="c0"), 1.0)
        assert [r.id for r in other.claim_many([("r0", None)], 2.0).claimed] == ["r0"]
        # An agent of r0 under the member's state directory, as a previous
        # process of it would have left (say the ledger was moved under it).
        env = {**os.environ, "HERDSMAN_RUN_ID": "r0", "HERDSMAN_STATE_DIR": str(state)}
        agent = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True
        )
        try:
            closing += start_members(tmp_path, fleet_url, 1, delay=0.1)
            member = closing[0]
            wait_for(lambda: "r0" in find_orphans(["r0"], state), 10, "no agent")
            # r0 runs under a live member: several of the member's checks and
            # renewals (3 s lease, 1 s poll) leave its agent alone.
            time.sleep(4)
            assert agent.poll() is None, member.output()
            # Its holder leaves; the member's next expiry records r0 lost and
            # the agent is stopped then.
            other.leave()
            assert agent.wait(timeout=20) is not None, member.output()
            record = other.get("r0")
            assert record is not None
            assert record.status is RunStatus.LOST
            assert member.stop(signal.SIGTERM) == 0, member.output()
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    finally:
        other.close()


def test_a_run_on_one_member_is_cancelled_through_another(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    closing += start_members(tmp_path, fleet_url, 2, delay=120)
    clients = [client(member) for member in closing]
    store = PostgresStore(postgres_url)
    try:
        ids = [c.get("/v1/status").json()["fleet"]["member_id"] for c in clients]
        answer = clients[0].post(
            "/v1/runs", json={"id": "long", "provider": "demo", "prompt": "x", "conversation": "c"}
        )
        assert answer.status_code == 201, answer.text
        deadline = time.monotonic() + 20
        while not (agents := processes_with_env("HERDSMAN_RUN_ID=long", tmp_path)):
            assert time.monotonic() < deadline, closing[0].output()
            time.sleep(0.05)
        with store._reading() as cur:
            (holder,) = cur.execute("SELECT held_by FROM runs WHERE id = 'long'").fetchone()
        held = ids.index(holder)  # whichever member claimed it first
        # Status through either member shows both, and who runs the run.
        shown = herdsman("status", *CLI, cwd=closing[1 - held].directory)
        assert shown.returncode == 0, shown.stderr
        assert "fleet: 2 member(s), 1 running" in shown.stdout
        answer = clients[1 - held].post("/v1/runs/long/cancel")
        assert answer.status_code == 200, answer.text
        assert (answer.json()["status"], answer.json()["reason"]) == (
            "cancelled",
            "cancel requested",
        )
        assert not any(process_alive(pid) for pid in agents)  # its process group is gone
        record = store.get("long")
        assert record is not None
        assert record.status is RunStatus.CANCELLED
        with store._reading() as cur:  # recorded by the member that held it
            assert cur.execute("SELECT held_by FROM runs WHERE id = 'long'").fetchone() == (holder,)
    finally:
        store.close()
        for each in clients:
            each.close()
    finishes = []
    for path in (closing[held].directory / "state" / "traces").glob("*.jsonl"):
        _, events = read_trace(path)
        finishes += [e.fields["outcome"] for e in events if e.event == "finish"]
    assert finishes == ["cancelled"]
    for member in closing:
        assert member.stop(signal.SIGTERM) == 0, member.output()


LIMIT_AGENT = Path(__file__).with_name("limit_agent.py")


def limit_member(
    directory: Path, url: str, account: str, *, gate: Path | None = None
) -> Supervisor:
    """A member whose provider "agent" (limit_agent.py) runs on one account.

    With a ``gate``, each agent waits until that file exists before it starts.
    """
    directory.mkdir()
    home = directory / "home"
    home.mkdir()
    records = directory / "records.jsonl"
    agent = f'"{sys.executable}", "{LIMIT_AGENT}", "plain", "{records}"'
    wait = "" if gate is None else f"until [ -e '{gate}' ]; do sleep 0.05; done; "
    provider = f"""
[providers.agent]
exec = ["sh", "-c", "{wait}exec \\"$0\\" \\"$@\\"", {agent}]
protocol = "plain"
concurrency = 1
usage_limit_pattern = 'LIMIT resets_at=(?P<resets_at>\\d+)'
[[providers.agent.accounts]]
name = "{account}"
env = {{ AGENT_HOME = "{home}" }}
"""
    write_config(directory, extra=provider + fleet_toml(url))
    return Supervisor(directory)


def test_a_run_requeued_by_a_member_that_stops_runs_on_another_without_a_restart(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    # A's account is out of quota; its agent says so once the test opens the
    # gate (a fixed sleep lost the race to B's start on a loaded machine).
    gate = tmp_path / "gate"
    first = limit_member(tmp_path / "a", fleet_url, "a", gate=gate)
    closing.append(first)
    (tmp_path / "a" / "home" / "limited").write_text(json.dumps({"resets_in": 600}))
    a = client(first)
    store = PostgresStore(postgres_url)
    try:
        answer = a.post("/v1/runs", json={"id": "r", "provider": "agent", "prompt": "x"})
        assert answer.status_code == 201, answer.text
        deadline = time.monotonic() + 20
        while (record := store.get("r")) is None or record.status is not RunStatus.RUNNING:
            assert time.monotonic() < deadline, first.output()
            time.sleep(0.05)
        # B joins while A runs "r": B's poll never sees it queued, and moves
        # past its seq with "s", which B runs.
        second = limit_member(tmp_path / "b", fleet_url, "b")
        closing.append(second)
        b = client(second)
        answer = b.post("/v1/runs", json={"id": "s", "provider": "agent", "prompt": "x"})
        assert answer.status_code == 201, answer.text
        assert b.get("/v1/runs/s", params={"wait": 20}).json()["status"] == "succeeded"
        still = store.get("r")
        assert still is not None
        assert still.status is RunStatus.RUNNING, "B ran s before A re-queued r"
        b_id = b.get("/v1/status").json()["fleet"]["member_id"]
        # A hits the limit, re-queues "r" (its account rests) and stops. B may
        # claim "r" at its next poll, before A stops: "r" is queued only until
        # then, so its attempt is what shows the re-queue, not its status.
        gate.touch()
        deadline = time.monotonic() + 30
        while (record := store.get("r")) is None or record.attempts < 1:
            assert time.monotonic() < deadline, first.output()
            time.sleep(0.05)
        a.close()
        assert first.stop(signal.SIGTERM) == 0, first.output()
        ended = b.get("/v1/runs/r", params={"wait": 20}).json()
        assert (ended["status"], ended["attempts"]) == ("succeeded", 2), ended
        with store._reading() as cur:
            assert cur.execute("SELECT held_by FROM runs WHERE id = 'r'").fetchone() == (b_id,)
        b.close()
    finally:
        store.close()
    assert second.stop(signal.SIGTERM) == 0, second.output()
