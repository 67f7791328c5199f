"""Fenced fleet members: no agent outlives its member's lease (docs/fleet.md, "Fencing").

Real `herdsman run` processes on a real PostgreSQL server, with a stand-in
agent (stamp_agent.py) that forks a child and records, in files of its
own, when each of its processes started and when it was last alive. The
members are killed with SIGKILL, or paused with SIGSTOP, while their agents
run; then, from those timestamps alone: no two runs of a conversation were
alive at once anywhere in the fleet, and no more agents were alive at once
than the fleet-wide cap allows.
"""

from __future__ import annotations

import itertools
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
from cli_support import Supervisor, process_alive, processes_with_env
from fleet_support import client, fleet_toml
from supervisor_support import write_config

from herdsman.runtime.store import RunRecord, RunStatus
from herdsman.runtime.store.postgres import PostgresStore

AGENT = Path(__file__).with_name("stamp_agent.py")
#: The fleet-wide cap on the stand-in provider; each member has 2 slots.
CAP = 4


@attrs.frozen
class Life:
    """When a run's agent processes were first started and last seen alive (wall clock)."""

    run_id: str
    start: float
    end: float


def lives(stamps: Path) -> dict[str, Life]:
    """Each run's life, from the files its agent's processes wrote."""
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    for path in stamps.iterdir():
        run_id = path.name.rsplit(".", 1)[0]
        lines = path.read_text().split()
        starts.setdefault(run_id, []).append(float(lines[0]))
        # A process killed before its first heartbeat was alive at its start.
        ends.setdefault(run_id, []).append(float(lines[-1]))
    return {r: Life(r, min(starts[r]), max(ends[r])) for r in sorted(starts)}


def check_lives(found: dict[str, Life], conversation_of: dict[str, str]) -> None:
    """No two runs of a conversation alive at once; never more than CAP agents alive."""
    by_conversation: dict[str, list[Life]] = {}
    for life in found.values():
        by_conversation.setdefault(conversation_of[life.run_id], []).append(life)
    for conversation, runs in sorted(by_conversation.items()):
        ordered = sorted(runs, key=lambda life: life.start)
        for before, after in itertools.pairwise(ordered):
            assert before.end < after.start, (
                f"{conversation}: {before.run_id} was alive {before.end - after.start:.3f} s"
                f" into {after.run_id}"
            )
    # A start counts before an end at the same instant: the worst case.
    edges = sorted(
        [(life.start, 0) for life in found.values()] + [(life.end, 1) for life in found.values()]
    )
    alive = peak = 0
    for _, kind in edges:
        alive += 1 if kind == 0 else -1
        peak = max(peak, alive)
    assert peak <= CAP, f"{peak} agents alive at once, over the fleet cap of {CAP}"


def member(directory: Path, url: str, stamps: Path) -> Supervisor:
    """A fleet member whose provider "stamp" runs the stand-in agent, 2 slots, cap CAP."""
    directory.mkdir()
    provider = f"""
[providers.stamp]
exec = ["{sys.executable}", "{AGENT}", "{stamps}"]
concurrency = 2
"""
    caps = f"provider_caps = {{ stamp = {CAP} }}\n"
    write_config(directory, extra=provider + fleet_toml(url, more=caps))
    return Supervisor(directory)


def submit(each: Supervisor, run_id: str, conversation: str, seconds: float) -> None:
    with client(each) as api:
        body = {
            "id": run_id,
            "provider": "stamp",
            "prompt": f"{seconds:.2f}",
            "conversation": conversation,
        }
        answer = api.post("/v1/runs", json=body)
        assert answer.status_code == 201, answer.text


def agents_of(each: Supervisor) -> list[int]:
    """Pids of the live processes of agents this member started."""
    state = each.directory / "state"
    return [
        pid
        for pid in processes_with_env(f"HERDSMAN_STATE_DIR={state}", each.directory)
        if process_alive(pid)
    ]


def settled(store: PostgresStore, ids: list[str]) -> list[RunRecord] | None:
    records = [store.get(run_id) for run_id in ids]
    if all(
        r is not None and r.status not in (RunStatus.QUEUED, RunStatus.RUNNING) for r in records
    ):
        return [r for r in records if r is not None]
    return None


def wait_for(condition: Callable[[], object], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def logs(members: list[Supervisor]) -> str:
    return "\n".join(f"--- {m.directory.name}\n{m.output()}" for m in members)


#: Conversations, runs per conversation, and the kills: all drawn from the seed.
SEED = 24
CONVERSATIONS = 5
RUNS_EACH = 2
KILLS = 2


@pytest.mark.slow
def test_members_killed_at_random_moments_never_let_runs_overlap_or_the_cap_be_passed(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    rng = random.Random(SEED)
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    names = iter(f"member{n}" for n in itertools.count())
    closing += [member(tmp_path / next(names), fleet_url, stamps) for _ in range(3)]
    live = list(closing)
    conversation_of: dict[str, str] = {}
    # Runs longer than the lease: an agent outliving its member would still
    # be alive when the member's runs are declared lost.
    for n in range(RUNS_EACH):
        for c in range(CONVERSATIONS):
            run_id = f"r{n}c{c}"
            conversation_of[run_id] = f"c{c}"
            submit(live[(n + c) % len(live)], run_id, f"c{c}", rng.uniform(5.0, 7.0))
    for _ in range(KILLS):
        # A member running agents (the case at stake), a moment after they started.
        wait_for(lambda: any(agents_of(each) for each in live), 20, lambda: logs(closing))
        time.sleep(rng.uniform(0.0, 1.0))
        running = [each for each in live if agents_of(each)] or live
        victim = running[rng.randrange(len(running))]
        victim.process.kill()
        victim.process.wait()
        live.remove(victim)
        # A new member on a state directory of its own: nobody restarts the
        # victim, so nobody but its fence stops its agents.
        closing.append(member(tmp_path / next(names), fleet_url, stamps))
        live.append(closing[-1])
    ids = sorted(conversation_of)
    store = PostgresStore(postgres_url)
    try:
        wait_for(lambda: settled(store, ids), 90, lambda: logs(closing))
        records = settled(store, ids)
    finally:
        store.close()
    assert records is not None
    statuses = {r.id: r.status for r in records}
    assert set(statuses.values()) <= {RunStatus.SUCCEEDED, RunStatus.LOST}, statuses
    lost = sorted(r.id for r in records if r.status is RunStatus.LOST)
    assert lost, "a victim was running a run when it was killed"
    found = lives(stamps)
    # Every run that succeeded had its agent; every agent belongs to a run.
    assert {r.id for r in records if r.status is RunStatus.SUCCEEDED} <= set(found)
    assert set(found) <= set(ids)
    check_lives(found, conversation_of)
    for each in live:
        code = each.stop(signal.SIGTERM)
        # A live member whose 3 s lease ran out on a loaded machine stopped
        # itself (exit 4, docs/fleet.md): the safe way, and the checks above hold.
        assert code == 0 or (code == 4 and "has expired" in each.output()), each.output()
    assert not any(agents_of(each) for each in closing)


def running_one(tmp_path: Path, url: str, closing: list[Supervisor], run_id: str) -> Supervisor:
    """A member (stamps in ``tmp_path/stamps``) running ``run_id`` on c0 for a minute."""
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    closing.append(member(tmp_path / "member0", url, stamps))
    running = closing[-1]
    submit(running, run_id, "c0", 60)
    # The agent and its child are both running.
    wait_for(lambda: len(agents_of(running)) == 2, 20, running.output)
    return running


def test_a_member_killed_and_never_restarted_leaves_no_agent_running(
    tmp_path: Path, fleet_url: str, closing: list[Supervisor]
) -> None:
    victim = running_one(tmp_path, fleet_url, closing, "long")
    agents = agents_of(victim)
    victim.process.kill()
    victim.process.wait()
    # Within a moment, not a lease: the keeper sees its pipe close.
    wait_for(lambda: not any(process_alive(pid) for pid in agents), 5, victim.output)
    # Said once they are gone.
    wait_for(lambda: "killed 1 agent process group(s)" in victim.output(), 5, victim.output)


@pytest.mark.slow
def test_a_paused_member_s_agents_die_before_another_member_runs_its_conversation(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    paused = running_one(tmp_path, fleet_url, closing, "first")
    stamps = tmp_path / "stamps"
    closing.append(member(tmp_path / "member1", fleet_url, stamps))
    other = closing[1]
    # As a long stall, a stopped VM's supervisor, or SIGSTOP: alive, silent.
    paused.process.send_signal(signal.SIGSTOP)
    try:
        submit(other, "second", "c0", 0.5)
        store = PostgresStore(postgres_url)
        try:
            wait_for(lambda: settled(store, ["first", "second"]), 30, lambda: logs(closing))
            records = {r.id: r for r in settled(store, ["first", "second"]) or []}
        finally:
            store.close()
        assert records["first"].status is RunStatus.LOST, records
        assert records["second"].status is RunStatus.SUCCEEDED, records
        # Killed by the paused member's keeper before its lease ran out.
        check_lives(lives(stamps), {"first": "c0", "second": "c0"})
        assert not agents_of(paused)
    finally:
        paused.process.send_signal(signal.SIGCONT)
    # Resumed, the member finds its fence fallen (or its lease expired) and stops.
    assert paused.process.wait(timeout=30) == 4, paused.output()
    assert "fleet" in paused.output()
    assert other.stop(signal.SIGTERM) == 0, other.output()
