"""The fence keeper and the member's side of it, with real processes (no ledger).

The keeper (fence_keeper.py) kills the process groups of the agents under
its state directory when its pipe closes or its deadline passes first, and
then keeps killing until the pipe closes; agents of another state
directory are never touched. The member's side (fence.py) says when the
fence has fallen.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio
from cli_support import process_alive, processes_with_env

from herdsman.runtime import fence as fence_module
from herdsman.runtime.fence import Fence, earlier_keepers
from herdsman.runtime.fence_keeper import fence_clock

# The agent forks a child, in its group, as agents' tools are.
AGENT = "import os, time\nos.fork()\ntime.sleep(60)\n"


class Agents:
    """Stand-in agents started under state directories, all reaped at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, state_dir: Path, run_id: str, *, wait: bool = True) -> str:
        """Start one (two processes) for ``run_id`` under ``state_dir``; its marker.

        ``wait``: until both processes are seen alive (not for an agent a
        fired keeper may kill before it has forked).
        """
        env = {
            **os.environ,
            "HERDSMAN_RUN_ID": run_id,
            "HERDSMAN_STATE_DIR": str(state_dir),
        }
        agent = subprocess.Popen(
            [sys.executable, "-c", AGENT], env=env, cwd=self.root, start_new_session=True
        )
        self.started.append(agent)
        marker = f"HERDSMAN_RUN_ID={run_id}"
        if wait:
            wait_until(lambda: len(self.alive(marker)) == 2, f"{run_id} did not start")
        return marker

    def alive(self, marker: str) -> list[int]:
        return [pid for pid in processes_with_env(marker, self.root) if process_alive(pid)]

    def keeper(self, state_dir: Path, deadline: float) -> subprocess.Popen[bytes]:
        """A fence keeper for ``state_dir``, stopped and reaped at the end like the agents."""
        process = subprocess.Popen(
            [sys.executable, "-m", "herdsman.runtime.fence_keeper", str(state_dir), repr(deadline)],
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for pipe in (process.stdin, process.stderr):
                if pipe is not None:
                    pipe.close()


def wait_until(condition: Callable[[], object], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    started = Agents(tmp_path)
    yield started
    started.close()


def test_the_keeper_kills_the_agents_of_its_state_dir_when_its_pipe_closes(
    tmp_path: Path, agents: Agents
) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    fenced = agents.start(mine, "r1")
    bystander = agents.start(other, "r2")
    process = agents.keeper(mine, fence_clock() + 60)
    assert process.stdin is not None
    time.sleep(0.5)
    assert len(agents.alive(fenced)) == 2  # the lease holds
    # The member's end of the pipe closes: it exited, however it exited.
    process.stdin.close()
    assert process.wait(timeout=10) == 0
    wait_until(lambda: not agents.alive(fenced), "the agent and its child outlived the member")
    assert len(agents.alive(bystander)) == 2
    assert process.stderr is not None
    with process.stderr:
        assert b"killed 1 agent process group(s)" in process.stderr.read()


def test_the_keeper_kills_them_at_the_deadline_and_until_its_pipe_closes(
    tmp_path: Path, agents: Agents
) -> None:
    fenced = agents.start(tmp_path, "r1")
    process = agents.keeper(tmp_path, fence_clock() + 0.5)
    assert process.stdin is not None
    try:
        # A renewal moves the deadline on: the agent lives past the first one.
        process.stdin.write(f"{fence_clock() + 1.5!r}\n".encode())
        process.stdin.flush()
        time.sleep(1.0)
        assert len(agents.alive(fenced)) == 2
        wait_until(lambda: not agents.alive(fenced), "the deadline passed, the agent lived on")
        # Fired, it stays fired: an agent started now (by a member that
        # resumes) dies too, and a later deadline changes nothing.
        process.stdin.write(f"{fence_clock() + 60!r}\n".encode())
        process.stdin.flush()
        # Not waited for: the keeper may kill it before it has forked.
        late = agents.start(tmp_path, "r2", wait=False)
        assert agents.started[-1].wait(timeout=10) == -signal.SIGKILL
        wait_until(lambda: not agents.alive(late), "an agent started after the deadline lived")
        assert process.poll() is None
    finally:
        process.stdin.close()
        code = process.wait(timeout=10)
    assert code == 0
    assert process.stderr is not None
    with process.stderr:
        assert b"not renewed in time" in process.stderr.read()


async def test_the_fence_falls_when_its_deadline_passes_without_an_extension(
    tmp_path: Path, agents: Agents
) -> None:
    fenced = await trio.to_thread.run_sync(agents.start, tmp_path, "r1")
    fence = await Fence.start(tmp_path, fence_clock() + 0.5)
    try:
        assert fence.extend(fence_clock() + 1.0)
        with trio.fail_after(10):
            why = await fence.wait_fallen()
        assert "not renewed before its deadline" in why
        assert fence_clock() >= fence.deadline
        assert not fence.extend(fence_clock() + 60)  # too late: it stays fallen
        await trio.to_thread.run_sync(
            wait_until, lambda: not agents.alive(fenced), "the agent outlived the deadline"
        )
    finally:
        await fence.close()


async def test_the_fence_falls_when_its_keeper_dies(tmp_path: Path) -> None:
    fence = await Fence.start(tmp_path, fence_clock() + 60)
    try:
        os.kill(fence.pid, signal.SIGKILL)
        with trio.fail_after(10):
            why = await fence.wait_fallen()
        assert why == f"the fence keeper (pid {fence.pid}) exited with status -9"
    finally:
        await fence.close()


async def test_the_fence_falls_when_its_keeper_is_stopped_and_close_lets_it_kill_the_agents(
    tmp_path: Path, agents: Agents
) -> None:
    # A stopped keeper kills nothing: as good as dead for the fence.
    fenced = await trio.to_thread.run_sync(agents.start, tmp_path, "r1")
    fence = await Fence.start(tmp_path, fence_clock() + 60)
    try:
        os.kill(fence.pid, signal.SIGSTOP)
        with trio.fail_after(10):
            why = await fence.wait_fallen()
        assert why.startswith(f"the fence keeper (pid {fence.pid}) is stopped")
        assert len(await trio.to_thread.run_sync(agents.alive, fenced)) == 2
    finally:
        # Closing continues it for its last task: without that, it would be
        # killed after the close's timeout with the agents still alive.
        await fence.close()
    assert not agents.alive(fenced)


async def test_a_keeper_stopped_at_one_look_only_is_not_taken_for_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A passing stop (a profiler's sample) seen at single looks never fells
    # the fence; seen at two looks in a row, it does.
    looks = iter([True, False, True, False, True, True])
    seen: list[int] = []

    def is_stopped(pid: int) -> bool:
        seen.append(pid)
        return next(looks, False)

    monkeypatch.setattr(fence_module, "is_stopped", is_stopped)
    fence = await Fence.start(tmp_path, fence_clock() + 60)
    try:
        with trio.fail_after(20):
            why = await fence.wait_fallen()
        assert why.startswith(f"the fence keeper (pid {fence.pid}) is stopped")
        assert seen == [fence.pid] * 6
    finally:
        await fence.close()


async def test_a_fence_closed_at_a_clean_stop_leaves_no_agent(
    tmp_path: Path, agents: Agents
) -> None:
    fenced = await trio.to_thread.run_sync(agents.start, tmp_path, "r1")
    fence = await Fence.start(tmp_path, fence_clock() + 60)
    assert fence.extend(fence_clock() + 60)
    await fence.close()
    assert not agents.alive(fenced)


async def test_a_fence_without_a_deadline_kills_only_when_its_pipe_closes(
    tmp_path: Path, agents: Agents
) -> None:
    # A sole supervisor's: no lease, so it falls only if its keeper dies.
    fenced = await trio.to_thread.run_sync(agents.start, tmp_path, "r1")
    fence = await Fence.start(tmp_path)
    try:
        with trio.move_on_after(0.5):
            await fence.wait_fallen()
        assert fence.fallen is None
        assert len(await trio.to_thread.run_sync(agents.alive, fenced)) == 2
    finally:
        await fence.close()
    assert not agents.alive(fenced)


def test_earlier_keepers_are_those_of_the_state_dir_alone(tmp_path: Path, agents: Agents) -> None:
    mine, longer = tmp_path / "state", tmp_path / "state2"
    started = [agents.keeper(mine, math.inf), agents.keeper(longer, math.inf)]
    try:
        # Found once each has exec'd (before, it runs this test's command line).
        wait_until(lambda: earlier_keepers(mine) == [started[0].pid], "its keeper not found")
        wait_until(lambda: earlier_keepers(longer) == [started[1].pid], "the other not found")
        assert earlier_keepers(mine) == [started[0].pid]
        assert earlier_keepers(tmp_path) == []
    finally:
        for process in started:
            assert process.stdin is not None
            process.stdin.close()
            process.wait(timeout=10)
            assert process.stderr is not None
            process.stderr.close()
    assert earlier_keepers(mine) == []
