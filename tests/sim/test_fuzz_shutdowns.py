"""The fuzzer's shutdown faults: a drain, a second signal, the grace running out, then a restart.

Each life's trace is also replayed on its own: every way the supervisor
stops must replay to the same decisions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
import trio

from herdsman.runtime.supervisor.execution import Execution
from herdsman.sim.decisions import timeline_of
from herdsman.sim.diff import first_divergence
from herdsman.sim.fuzz.harness import Verdict, run_scenario
from herdsman.sim.fuzz.scenario import Scenario, ScenarioError, draw_scenario, scenario_from_json
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload_text
from herdsman.trace import read_trace_text

CONFIG = """\
[supervisor]
state_dir = "/herdsman-sim/state"
shutdown_grace = "{grace}"
[providers.claude]
exec = ["claude"]
concurrency = 2
"""


def _submit(t: float, run_id: str, duration: float = 30.0) -> dict[str, Any]:
    run = {"id": run_id, "provider": "claude", "conversation": run_id, "workspace": "default"}
    attempts = [{"duration": duration, "outcome": "succeeded"}]
    return {"t": t, "kind": "submit", "run": run, "attempts": attempts}


def _lives(verdict: Verdict) -> list[list[Mapping[str, Any]]]:
    return [[json.loads(line) for line in text.splitlines()[1:]] for text in verdict.traces]


def _outcomes(events: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    return [(e["run_id"], e["outcome"]) for e in events if e["event"] == "finish"]


def _replays_the_same(verdict: Verdict) -> None:
    for n, text in enumerate(verdict.traces):
        workload = read_workload_text(text, f"life {n}")
        result = replay(workload, config_from_trace(workload.header.config, "header"))
        recorded = timeline_of(read_trace_text(text, "recorded")[1], workload.header.carry)
        replayed = timeline_of(read_trace_text(result.trace, "replayed")[1])
        assert first_divergence(recorded, replayed) is None, (n, text)


def _run(*events: Mapping[str, Any], grace: str = "10m") -> Verdict:
    verdict = run_scenario(Scenario(7, CONFIG.format(grace=grace), tuple(events)))
    assert verdict.violations == ()
    _replays_the_same(verdict)
    return verdict


def test_a_drain_lets_running_runs_finish_and_the_restart_runs_the_queued_ones() -> None:
    verdict = _run(
        *(_submit(0.0, f"r{n}") for n in range(1, 4)),
        {"t": 5.0, "kind": "shutdown", "force_after": None},
    )
    first, second = _lives(verdict)
    assert _outcomes(first) == [("r1", "succeeded"), ("r2", "succeeded")]
    assert [e["run"]["id"] for e in second if e["event"] == "submit"] == ["r3"]
    assert _outcomes(second) == [("r3", "succeeded")]


def test_a_second_signal_cancels_the_running_runs_in_submission_order() -> None:
    # r2 would end first; both are cancelled at the second signal.
    verdict = _run(
        _submit(0.0, "r1", 50.0),
        _submit(0.0, "r2", 20.0),
        _submit(0.0, "r3"),
        {"t": 5.0, "kind": "shutdown", "force_after": 5.0},
    )
    first, second = _lives(verdict)
    assert [e.get("forced", False) for e in first if e["event"] == "shutdown"] == [False, True]
    assert _outcomes(first) == [("r1", "cancelled"), ("r2", "cancelled")]
    assert _outcomes(second) == [("r3", "succeeded")]


def test_the_grace_running_out_cancels_what_still_runs() -> None:
    verdict = _run(
        _submit(0.0, "r1", 5.0),
        _submit(0.0, "r2", 100.0),
        {"t": 1.0, "kind": "shutdown", "force_after": None},
        grace="10s",
    )
    first, _ = _lives(verdict)
    assert _outcomes(first) == [("r1", "succeeded"), ("r2", "cancelled")]
    forced = [e for e in first if e["event"] == "shutdown" and e.get("forced")]
    assert [e["t"] for e in forced] == [11.0]


def test_seeds_draw_every_shutdown_and_short_graces() -> None:
    drawn = [draw_scenario(seed) for seed in range(60)]
    stops = [e for s in drawn for e in s.events if e["kind"] == "shutdown"]
    assert {e["force_after"] is None for e in stops} == {True, False}
    assert any('shutdown_grace = "' in s.config for s in drawn)


def test_a_shutdown_s_force_after_is_checked() -> None:
    case = json.dumps(
        {
            "version": 1,
            "seed": 1,
            "config": CONFIG,
            "events": [{"t": 0, "kind": "shutdown", "force_after": -1}],
        }
    )
    with pytest.raises(ScenarioError, match="force_after: expected seconds >= 0"):
        scenario_from_json(json.loads(case), "case.jsonl")


def test_a_run_slow_to_record_its_end_after_a_forced_stop_still_lets_the_supervisor_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # r1's end takes 30 s to record (a slow ledger): past the forced stop's
    # wait of 15 s, its task is cancelled outright, and the stop waits on.
    honest = Execution._record_finish

    async def slow(self: Execution, record: Any, ended: Any, **options: Any) -> Any:
        if record.id == "r1":
            with trio.CancelScope(shield=True):
                await trio.sleep(30)
        return await honest(self, record, ended, **options)

    monkeypatch.setattr(Execution, "_record_finish", slow)
    verdict = _run(
        _submit(0.0, "r1", 100.0),
        _submit(0.0, "r2", 100.0),
        {"t": 5.0, "kind": "shutdown", "force_after": 0.0},
    )
    first, second = _lives(verdict)
    # r2 waited for r1's turn only until the forced stop's deadline.
    assert _outcomes(first) == [("r2", "cancelled"), ("r1", "cancelled")]
    assert [e["t"] for e in first if e["event"] == "finish"] == [20.0, 35.0]
    assert second == []  # started again, with nothing left to do
