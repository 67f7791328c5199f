"""Agents a fleet member's earlier process left: watched until the ledger ends their runs.

Real processes (a sleeping 'agent' in its own session, with the environment
the runner gives agents) and a real ledger; the ledger's changes stand for
the fleet's (a lease expiry records the run lost). The agents are this
test's children: stopped, they stay zombies until reaped, so each stop waits
out its (short) grace.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from herdsman.core import RunRequest
from herdsman.runtime.ledger import Ledger, inline
from herdsman.runtime.left_agents import LeftAgents
from herdsman.runtime.store import MemoryStore, NewRun, RunEnd, RunStatus
from herdsman.runtime.store.sqlite import SqliteStore

AGENT = "import time; time.sleep(60)"


def spawn_agent(state_dir: Path, run_id: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HERDSMAN_RUN_ID": run_id, "HERDSMAN_STATE_DIR": str(state_dir)}
    return subprocess.Popen([sys.executable, "-c", AGENT], env=env, start_new_session=True)


@pytest.fixture
def agents() -> Iterator[list[subprocess.Popen[bytes]]]:
    spawned: list[subprocess.Popen[bytes]] = []
    yield spawned
    for process in spawned:
        if process.poll() is None:
            os.killpg(process.pid, 9)
        process.wait()


def running_run(store: MemoryStore | SqliteStore, run_id: str, conversation: str) -> None:
    store.submit(NewRun(id=run_id, provider="demo", prompt="p", conversation=conversation), 1.0)
    store.mark_running_many([(run_id, None)], 2.0)


def wait_for_environ(process: subprocess.Popen[bytes]) -> None:
    """Until the child has exec'd: before, /proc shows the parent's environment."""
    deadline = time.monotonic() + 10
    while b"HERDSMAN_RUN_ID" not in Path(f"/proc/{process.pid}/environ").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.01)


async def test_an_agent_is_stopped_only_once_its_run_is_no_longer_running(
    tmp_path: Path, agents: list[subprocess.Popen[bytes]]
) -> None:
    state = tmp_path / "state"
    store = MemoryStore()
    running_run(store, "old", "c1")
    running_run(store, "elsewhere", "c2")
    agents.append(spawn_agent(state, "old"))
    # Another state directory's agent, and an agent of a run this ledger does not know.
    agents.append(spawn_agent(tmp_path / "other-state", "elsewhere"))
    agents.append(spawn_agent(state, "unknown"))
    for agent in agents:
        wait_for_environ(agent)
    ledger = Ledger(store, run_sync=inline)
    left = LeftAgents(state, agent_exclusive=True)
    await left.find(ledger)
    assert left.watched == ("old",)

    # Still running as far as the ledger knows (its member's lease holds): left alone.
    assert await left.stop_ended(ledger, grace=1) == {}
    assert agents[0].poll() is None
    # A run of its conversation waits; one of another conversation does not.
    with trio.fail_after(5):
        await left.clear_of(RunRequest("x", "demo", "c2", None))
    waited = trio.Event()

    async def start_in_c1() -> None:
        await left.clear_of(RunRequest("y", "demo", "c1", None))
        waited.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(start_in_c1)
        await trio.sleep(0.2)
        assert not waited.is_set()

        # The expiry of its member's lease records it lost: now it is stopped.
        store.finish("old", RunEnd(RunStatus.LOST, reason="supervisor h:1 lease expired"), 3.0)
        stopped = await left.stop_ended(ledger, grace=1)
        assert stopped == {"old": {agents[0].pid}}
        assert agents[0].wait(timeout=5) is not None
        with trio.fail_after(5):
            await waited.wait()
    assert not left.watched
    # Nothing else was touched.
    assert [agent.poll() for agent in agents[1:]] == [None, None]


async def test_an_agent_of_a_run_lost_before_the_start_is_stopped_at_the_first_look(
    tmp_path: Path, agents: list[subprocess.Popen[bytes]]
) -> None:
    state = tmp_path / "state"
    store = SqliteStore(tmp_path / "ledger.db")
    try:
        running_run(store, "old", "c1")
        store.finish("old", RunEnd(RunStatus.LOST, reason="supervisor h:1 lease expired"), 3.0)
        agents.append(spawn_agent(state, "old"))
        wait_for_environ(agents[0])
        ledger = Ledger(store, run_sync=inline)
        left = LeftAgents(state, agent_exclusive=True)
        await left.find(ledger)
        assert await left.stop_ended(ledger, grace=1) == {"old": {agents[0].pid}}
        assert agents[0].wait(timeout=5) is not None
    finally:
        store.close()
