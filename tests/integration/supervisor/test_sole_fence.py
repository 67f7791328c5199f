"""A sole supervisor's agents die with it (docs/operations.md, "When the supervisor dies").

Real `herdsman run` processes on SQLite, with a stand-in agent
(stamp_agent.py) that forks a child and records, in files of its own, when
each of its processes started and when it was last alive. The supervisor
is killed with SIGKILL and never restarted, or stopped with SIGINT, or its
fence keeper is killed; then, from the processes and the timestamps: no
agent outlives a killed supervisor, and one it lets finish finishes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cli_support import (
    CLI,
    Supervisor,
    fence_keepers_of,
    herdsman,
    process_alive,
    processes_with_env,
)
from supervisor_support import write_config

from herdsman.runtime.store import RunStatus, SqliteStore

AGENT = Path(__file__).with_name("stamp_agent.py")
#: Within this many seconds of the supervisor's death its agents must be gone
#: (they die within milliseconds; the rest is room for a loaded machine).
GONE_WITHIN = 5.0


def sole(directory: Path, stamps: Path) -> Supervisor:
    """A sole supervisor (SQLite) whose provider "stamp" runs the stand-in agent."""
    provider = f"""
[providers.stamp]
exec = ["{sys.executable}", "{AGENT}", "{stamps}"]
concurrency = 1
"""
    write_config(directory, extra=provider)
    return Supervisor(directory)


def submit(directory: Path, run_id: str, seconds: float, *wait: str) -> str:
    result = herdsman(
        "submit",
        *CLI,
        "-p",
        "stamp",
        "--id",
        run_id,
        "--conversation",
        "c0",
        *wait,
        f"{seconds:.2f}",
        cwd=directory,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def agents_of(directory: Path) -> list[int]:
    """Pids of the live processes of agents started under ``directory``'s state dir."""
    state = directory / "state"
    return [
        pid
        for pid in processes_with_env(f"HERDSMAN_STATE_DIR={state}", directory)
        if process_alive(pid)
    ]


def wait_for(condition: Callable[[], object], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def stamped(stamps: Path, run_id: str) -> list[tuple[float, float]]:
    """(start, last seen alive) of each process of ``run_id``'s agent."""
    found = []
    for path in sorted(stamps.glob(f"{run_id}.*")):
        lines = path.read_text().split()
        found.append((float(lines[0]), float(lines[-1])))
    return found


def running(tmp_path: Path, run_id: str, seconds: float) -> tuple[Supervisor, Path]:
    """A sole supervisor in ``tmp_path`` running ``run_id`` (agent and child), and the stamps."""
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    sup = sole(tmp_path, stamps)
    submit(tmp_path, run_id, seconds)
    wait_for(lambda: len(agents_of(tmp_path)) == 2, 20, sup.output)
    return sup, stamps


def test_a_sole_supervisor_killed_takes_its_agents_with_it_and_a_restart_reports_the_run_lost(
    tmp_path: Path,
) -> None:
    sup, stamps = running(tmp_path, "long", 60)
    try:
        agents = agents_of(tmp_path)
        sup.process.kill()  # SIGKILL: no cleanup at all, and nobody restarts it (yet)
        sup.process.wait()
        wait_for(lambda: not any(process_alive(pid) for pid in agents), GONE_WITHIN, sup.output)
        wait_for(lambda: "killed 1 agent process group(s)" in sup.output(), 5, sup.output)
    finally:
        sup.close()
    # Started again on the same state directory: the run is reported lost,
    # never run again, and no agent was left for it to stop.
    again = Supervisor(tmp_path)
    try:
        assert submit(tmp_path, "after", 0.2, "--wait", "--wait-timeout", "30")
        assert again.stop(signal.SIGTERM) == 0, again.output()
    finally:
        again.close()
    assert "agent process group(s) of lost runs" not in again.output()
    store = SqliteStore(tmp_path / "state" / "herdsman.db")
    try:
        long, after = store.get("long"), store.get("after")
    finally:
        store.close()
    assert long is not None
    assert after is not None
    assert (long.status, long.reason, long.attempts) == (
        RunStatus.LOST,
        "supervisor restarted before this run finished",
        1,
    )
    assert long.notes == ()
    assert after.status is RunStatus.SUCCEEDED
    # One agent and its child ever ran for "long"; both were dead before
    # "after" started.
    lives = stamped(stamps, "long")
    assert len(lives) == 2
    [(after_start, _), _] = stamped(stamps, "after")
    assert max(end for _, end in lives) < after_start


def test_a_drain_lets_the_agent_finish_before_the_keeper_goes(tmp_path: Path) -> None:
    seconds = 2.0
    sup, stamps = running(tmp_path, "short", seconds)
    try:
        sup.process.send_signal(signal.SIGINT)
        assert sup.process.wait(timeout=60) == 0, sup.output()
    finally:
        sup.close()
    assert "killed" not in sup.output()
    # Both processes lived their whole time: nothing killed them on the way.
    lives = stamped(stamps, "short")
    assert len(lives) == 2
    assert all(end - start >= seconds for start, end in lives), lives
    store = SqliteStore(tmp_path / "state" / "herdsman.db")
    try:
        record = store.get("short")
    finally:
        store.close()
    assert record is not None
    assert record.status is RunStatus.SUCCEEDED


def test_a_killed_keeper_is_reported_and_replaced_and_the_agents_still_die_with_the_supervisor(
    tmp_path: Path,
) -> None:
    sup, _ = running(tmp_path, "long", 60)
    try:
        [keeper] = fence_keepers_of(sup.process.pid)
        os.kill(keeper, signal.SIGKILL)
        wait_for(lambda: "started a new fence keeper" in sup.output(), 20, sup.output)
        assert f"the fence keeper (pid {keeper}) exited with status -9" in sup.output()
        [replacement] = fence_keepers_of(sup.process.pid)
        assert replacement != keeper
        # The supervisor goes on: its run is not stopped.
        agents = agents_of(tmp_path)
        assert len(agents) == 2
        assert sup.process.poll() is None
        sup.process.kill()
        sup.process.wait()
        wait_for(lambda: not any(process_alive(pid) for pid in agents), GONE_WITHIN, sup.output)
    finally:
        sup.close()


def test_a_stopped_keeper_is_replaced_without_its_agents_being_killed(tmp_path: Path) -> None:
    # Stopped, it would kill nothing should the supervisor die. Replaced, it
    # is killed, not continued: continued with its pipe closed, it would
    # kill the agents of the supervisor still running them.
    sup, _ = running(tmp_path, "long", 60)
    try:
        [keeper] = fence_keepers_of(sup.process.pid)
        agents = agents_of(tmp_path)
        os.kill(keeper, signal.SIGSTOP)
        wait_for(lambda: "started a new fence keeper" in sup.output(), 20, sup.output)
        assert f"the fence keeper (pid {keeper}) is stopped" in sup.output()
        assert not process_alive(keeper)
        [replacement] = fence_keepers_of(sup.process.pid)
        assert replacement != keeper
        assert all(process_alive(pid) for pid in agents)
        assert sup.process.poll() is None
        sup.process.kill()
        sup.process.wait()
        wait_for(lambda: not any(process_alive(pid) for pid in agents), GONE_WITHIN, sup.output)
    finally:
        with contextlib.suppress(ProcessLookupError):  # never left stopped
            os.kill(keeper, signal.SIGCONT)
        sup.close()


def test_a_supervisor_started_again_waits_for_its_predecessor_s_keeper(tmp_path: Path) -> None:
    sup, stamps = running(tmp_path, "long", 60)
    agents = agents_of(tmp_path)
    [keeper] = fence_keepers_of(sup.process.pid)
    try:
        # A keeper held up (on a machine loaded to a standstill, say) when its
        # supervisor dies: the agents are still alive as a new one starts.
        os.kill(keeper, signal.SIGSTOP)
        sup.process.kill()
        sup.process.wait()
        again = Supervisor(tmp_path, wait=False)
        try:
            try:
                again.wait_for(
                    f"waiting for the fence keeper(s) of a previous supervisor (pid {keeper})"
                )
                assert "herdsman is running" not in again.output()
            finally:
                os.kill(keeper, signal.SIGCONT)
            # It starts only once that keeper has killed its agents and gone.
            again.wait_for("herdsman is running")
            assert not any(process_alive(pid) for pid in agents)
            assert not process_alive(keeper)
            assert submit(tmp_path, "after", 0.5, "--wait", "--wait-timeout", "30")
            assert again.stop(signal.SIGTERM) == 0, again.output()
        finally:
            again.close()
    finally:
        with contextlib.suppress(ProcessLookupError):  # never left stopped
            os.kill(keeper, signal.SIGCONT)
        sup.close()
    [(start, end), _] = stamped(stamps, "after")
    assert end - start >= 0.5
