"""A hang is a finding: every fuzz scenario ends in a verdict, bounded in simulated and wall time.

Seeds 5002 and 5083 used to hang for ever: a client's submit waited (as it
should) for its conversation's worktree removal to finish under slow git,
and the driver — the one task that moves the simulated clock — was the
task waiting. Each test here runs with the harness's own wall-time bound,
so a regression is a failure with a message, never a test that hangs
(those two seeds are among test_fuzz_batch.py's regression seeds).
Liveness bugs are planted (monkeypatches) the way the fuzzer's other
tests plant theirs, and must come out as violations, with the command
that reproduces them and a minimised case file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from test_fuzz_faults import CONFIG  # one repository, idle 0 s, swept every 30 s

from herdsman.cli import main
from herdsman.runtime.git.fake import FakeGit
from herdsman.runtime.supervisor import Supervisor
from herdsman.runtime.supervisor.dispatch import Dispatcher
from herdsman.runtime.supervisor.recovery import Recovery
from herdsman.sim.fuzz import harness
from herdsman.sim.fuzz.cli import WALL_LIMIT_DEFAULT
from herdsman.sim.fuzz.harness import Verdict, run_scenario
from herdsman.sim.fuzz.scenario import Scenario, draw_scenario

pytestmark = pytest.mark.usefixtures("quiet_herdsman")

#: Generous: these scenarios take a second or two; only a hang meets it.
BOUND = 120.0


def _submit(t: float, run_id: str) -> dict[str, Any]:
    return {
        "t": t,
        "kind": "submit",
        "run": {"id": run_id, "provider": "claude", "conversation": "c1", "workspace": "default"},
        "attempts": [{"duration": 1.0, "outcome": "succeeded"}],
    }


def _traced(verdict: Verdict, event: str) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for text in verdict.traces
        for line in text.splitlines()[1:]
        if json.loads(line)["event"] == event
    ]


def test_a_submit_waits_out_a_worktree_removal_while_the_clock_moves() -> None:
    # Git takes 40 s a call: the sweep that finds c1 idle at t=150 checks its
    # worktree (clean, and still git's checkout of the conversation's branch:
    # three calls) until 270 and removes it until 310; r2, sent at 290, waits.
    scenario = Scenario(7, CONFIG, (_submit(0.0, "r1"), _submit(290.0, "r2")), git_latency=40.0)
    verdict = run_scenario(scenario, wall_limit=BOUND)
    assert verdict.violations == ()
    submitted = {e["run"]["id"]: e["t"] for e in _traced(verdict, "submit")}
    assert submitted["r1"] == 0.0
    assert 310.0 <= submitted["r2"] < 311.0
    assert [e["run_id"] for e in _traced(verdict, "finish")] == ["r1", "r2"]


async def _never_done(self: FakeGit, repo: Path, path: Path) -> None:
    # A removal that never finishes: the next submit of its conversation
    # waits for ever. (One that git finished but the supervisor still took
    # for under way would be a `removal wait` finding first.)
    await trio.sleep_forever()


@pytest.mark.slow
def test_a_submit_that_never_returns_is_a_liveness_finding_with_a_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeGit, "remove_worktree", _never_done)
    case = tmp_path / "case.jsonl"
    args = ["sim", "fuzz", "--seeds", "40", "--out", str(case), "--wall-limit", str(BOUND)]
    assert main(args) == 1
    lines = capsys.readouterr().out.splitlines()
    seed = int(lines[0].split()[1])
    assert ": liveness: the submit of r" in lines[1]
    assert "never returned" in lines[1]
    assert lines[2] == f"reproduce: herdsman sim fuzz --seeds 1 --seed {seed}"
    kept, whole = int(lines[3].split()[2]), int(lines[3].split()[4])
    assert kept < whole
    assert ": liveness: " in lines[4]
    assert json.loads(case.read_text())["fuzz"]["seed"] == seed
    # The case replays to the same finding, and holds once the bug is gone.
    replay = ["sim", "replay", str(case), "--out", str(tmp_path / "out.jsonl")]
    assert main(replay) == 1
    assert ": liveness: " in capsys.readouterr().err
    monkeypatch.undo()
    assert main(replay) == 0
    assert capsys.readouterr().err.endswith("every invariant held\n")


def test_runs_that_could_start_and_never_do_are_a_drain_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def idle(self: Dispatcher) -> None:
        await trio.sleep_forever()  # a dispatcher that never starts anything

    monkeypatch.setattr(Dispatcher, "dispatch_loop", idle)
    verdict = run_scenario(draw_scenario(0), wall_limit=BOUND)
    first = verdict.violations[0]
    assert first.kind == "drain"
    # Seed 0 also draws a shutdown: r003, which a finish would have started
    # during the drain, waits for the restarted supervisor's idle dispatcher.
    assert "never finished at the bound after the last fault: r003 (queued)" in first.message


def test_a_restart_that_never_recovers_is_a_liveness_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest = Recovery.recover
    lives: list[Recovery] = []

    async def stuck_the_second_time(self: Recovery) -> None:
        lives.append(self)
        if len(lives) > 1:
            await trio.Event().wait()  # waits for what never comes, with no timer
        await honest(self)

    monkeypatch.setattr(Recovery, "recover", stuck_the_second_time)
    verdict = run_scenario(draw_scenario(5), wall_limit=BOUND)  # seed 5 has a crash
    first = verdict.violations[0]
    assert first.kind == "liveness"
    assert first.message.startswith("every task waits while the supervisor recovers after a crash")


def test_a_restart_that_waits_for_a_thread_is_no_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    honest = Recovery.recover
    lives: list[Recovery] = []

    async def slow_to_read(self: Recovery) -> None:
        lives.append(self)
        if len(lives) > 1:
            # Real work in one of trio's threads: every task waits meanwhile,
            # and no simulated time must pass for it.
            await trio.to_thread.run_sync(time.sleep, 0.2)
        await honest(self)

    monkeypatch.setattr(Recovery, "recover", slow_to_read)
    verdict = run_scenario(draw_scenario(5), wall_limit=BOUND)
    assert len(lives) > 1  # it did restart
    assert verdict.violations == ()


def test_tasks_that_never_let_the_clock_move_are_a_liveness_finding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def spinning(self: Dispatcher) -> None:
        while True:  # yields, never waits: the clock can never move
            await trio.lowlevel.checkpoint()

    monkeypatch.setattr(Dispatcher, "dispatch_loop", spinning)
    verdict = run_scenario(draw_scenario(0), wall_limit=BOUND)
    first = verdict.violations[0]
    assert first.kind == "liveness"
    assert first.message.endswith("task steps at t=0.000 and the clock never moved")
    assert first.message.startswith(f"{harness.STEPS_AT_ONE_INSTANT} ")


def test_a_scenario_past_its_wall_time_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    honest = Supervisor.submit_each

    async def blocking(self: Supervisor, items: Any) -> Any:
        time.sleep(2)  # holds the whole thread: nothing in simulated time can see it
        await trio.lowlevel.checkpoint()
        return await honest(self, items)

    monkeypatch.setattr(Supervisor, "submit_each", blocking)
    verdict = run_scenario(draw_scenario(0), wall_limit=0.5)
    first = verdict.violations[0]
    assert first.kind == "wall time"
    assert first.message.startswith("no verdict after 0.5s of wall time")


def test_the_commands_default_wall_limit_is_the_harness_s() -> None:
    assert WALL_LIMIT_DEFAULT == harness.WALL_LIMIT
