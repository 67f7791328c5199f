"""The sample traces under sim/ replay to their golden outputs, byte for byte."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from herdsman.sim.chrome import chrome_trace
from herdsman.sim.decisions import read_decisions, timeline_of
from herdsman.sim.diff import first_divergence
from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.result import recording_ends, summary
from herdsman.sim.workload import config_from_trace, read_workload
from herdsman.trace import read_trace_text

SIM = Path(__file__).parents[2] / "sim"


RECORDED_STOPS = ("stop-forced", "stop-killed", "stop-restarted")


@pytest.mark.parametrize(
    "name", ["demo-recorded", "team-day", *RECORDED_STOPS, "sweeps-recorded", "faults-recorded"]
)
def test_a_shipped_input_replays_to_its_golden_output(name: str) -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    workload = read_workload(SIM / f"{name}.jsonl")
    result = replay(workload, config_from_trace(workload.header.config, name))
    golden = (SIM / f"{name}.golden.jsonl").read_text(encoding="utf-8")
    assert result.trace == golden, (
        f"sim/{name} no longer replays to its golden output; if the change is meant,"
        " run `.venv/bin/python sim/regenerate.py` and review `git diff sim/`"
    )


def test_the_recorded_demo_replays_with_the_recorded_decisions() -> None:
    recorded = read_decisions(SIM / "demo-recorded.jsonl")
    replayed = read_decisions(SIM / "demo-recorded.golden.jsonl")
    assert first_divergence(recorded, replayed) is None


def test_the_team_day_exercises_every_kind_of_decision() -> None:
    kinds = {d.kind for d in read_decisions(SIM / "team-day.golden.jsonl").decisions}
    assert kinds >= {"start", "finish", "usage_limit"}
    text = (SIM / "team-day.golden.jsonl").read_text()
    assert '"event":"reload"' in text
    assert '"account":"spare"' in text


@pytest.mark.parametrize("name", RECORDED_STOPS)
def test_each_life_of_a_stopped_supervisor_replays_with_its_decisions(name: str) -> None:
    recorded = read_decisions(SIM / f"{name}.jsonl")
    assert first_divergence(recorded, read_decisions(SIM / f"{name}.golden.jsonl")) is None
    workload = read_workload(SIM / f"{name}.jsonl")
    fast = fast_replay(workload, config_from_trace(workload.header.config, name))
    if workload.lost:  # the fast engine has no ledger for recovery to find them in
        assert "found lost at start-up" in summary(recording_ends(fast, workload))
    else:
        assert first_divergence(recorded, timeline_of(read_trace_text(fast.trace, name)[1])) is None


def test_the_trio_replay_of_a_restarted_life_says_what_became_of_its_lost_runs() -> None:
    # A file begun by a restart can hold little else: "replayed 2 runs" alone
    # would hide the four runs the recording began by finding lost.
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    workload = read_workload(SIM / "stop-restarted.jsonl")
    result = replay(workload, config_from_trace(workload.header.config, "stop-restarted"))
    replayed = timeline_of(read_trace_text(result.trace, "stop-restarted")[1])
    assert [d.run_id for d in replayed.decisions if d.kind == "lost"] == list(workload.lost)
    assert len(workload.lost) == 4
    assert (
        "; the recording begins with 4 run(s) found lost at start-up (left running by the"
        " supervisor before it): the replay puts them in its ledger as running, and its"
        " recovery records them lost as the recorded one did (they are not among the runs"
        " replayed)"
    ) in summary(result)


def test_the_stopped_supervisor_s_lives_hold_every_way_it_stops() -> None:
    events = {
        name: [json.loads(line) for line in (SIM / f"{name}.jsonl").read_text().splitlines()[1:]]
        for name in RECORDED_STOPS
    }
    forced = events["stop-forced"]
    kinds = {e["event"] for e in forced}
    assert kinds >= {"skip", "cancel", "reload", "reload_rejected", "shutdown"}
    outcomes = [e["outcome"] for e in forced if e["event"] == "finish"]
    assert {"timed_out", "cancelled", "succeeded"} <= set(outcomes)
    stopped = forced[[e.get("forced") for e in forced].index(True) + 1 :]
    submitted = [e["run"]["id"] for e in forced if e["event"] == "submit"]
    cancelled = [e["run_id"] for e in stopped if e["event"] == "finish"]
    assert len(cancelled) >= 2
    assert cancelled == sorted(cancelled, key=submitted.index)
    assert read_workload(SIM / "stop-killed.jsonl").cut_at is not None
    assert next(e["event"] for e in events["stop-restarted"]) == "lost"


def test_the_recorded_sweeps_replay_with_their_decisions_on_both_engines() -> None:
    recorded = read_decisions(SIM / "sweeps-recorded.jsonl")
    assert first_divergence(recorded, read_decisions(SIM / "sweeps-recorded.golden.jsonl")) is None
    workload = read_workload(SIM / "sweeps-recorded.jsonl")
    fast = fast_replay(workload, config_from_trace(workload.header.config, "sweeps-recorded"))
    assert fast.trace == (SIM / "sweeps-recorded.golden.jsonl").read_text(encoding="utf-8")


def test_the_recorded_sweeps_hold_a_skip_during_a_submit_s_wait_for_a_removal() -> None:
    # What only the removal_wait event lets a replay decide as recorded: the
    # skip is refused because the waiting submit has claimed c0 already.
    events = [json.loads(line) for line in (SIM / "sweeps-recorded.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events[1:]]
    waited = kinds.index("removal_wait")
    held = events[1 + waited]["run_id"]
    submitted = [e["run"]["id"] for e in events[1:] if e["event"] == "submit"]
    assert submitted.count(held) == 1
    between = events[2 + waited : 1 + kinds.index("submit", waited)]
    skips = [e["run"]["conversation"] for e in between if e["event"] == "skip"]
    assert skips == ["c0"]
    assert events[0]["config"]["retention"]["sweep_interval"] == "1s"
    assert [r["name"] for r in events[0]["config"]["repos"]] == ["repo"]


def test_the_recorded_faults_replay_with_their_retries_warning_and_refused_login() -> None:
    recorded = read_decisions(SIM / "faults-recorded.jsonl")
    assert first_divergence(recorded, read_decisions(SIM / "faults-recorded.golden.jsonl")) is None
    kinds = [d.kind for d in recorded.decisions]
    assert kinds.count("retry") >= 4
    assert kinds.count("near_limit") == kinds.count("needs_login") == 1
    finishes = [
        json.loads(line)
        for line in (SIM / "faults-recorded.jsonl").read_text().splitlines()[1:]
        if '"event":"finish"' in line
    ]
    # A failure that ran out of retries, one after work (never retried), a crash.
    assert sum(f.get("failure") == "rate_limit" and "requeued" not in f for f in finishes) == 1
    assert sum(f.get("worked") is True for f in finishes) == 1
    assert any(f.get("failure") == "crash" for f in finishes)
    assert any(f["outcome"] == "usage_limited" and f.get("requeued") for f in finishes)
    assert sum("spend" in f for f in finishes) >= 6


def test_the_recorded_faults_are_retried_by_the_replay_s_own_policy() -> None:
    """A what-if with a single attempt retries nothing: the replay decides, it does not copy."""
    workload = read_workload(SIM / "faults-recorded.jsonl")
    once = config_from_trace(workload.header.config, "faults", ["providers.agent.retry.attempts=1"])
    for result in (replay(workload, once), fast_replay(workload, once)):
        events = list(read_trace_text(result.trace, "what-if")[1])
        assert not [e for e in events if e.event == "retry"]
        agent = {
            e.fields["run"]["id"]
            for e in events
            if e.event == "submit" and e.fields["run"]["provider"] == "agent"
        }
        ended = [e.fields for e in events if e.event == "finish" and e.fields["run_id"] in agent]
        assert len(ended) == 4
        assert all(f["outcome"] == "failed" for f in ended)


def test_the_chrome_timeline_marks_the_recorded_retries_warning_and_refused_login() -> None:
    timeline = chrome_trace(read_decisions(SIM / "faults-recorded.golden.jsonl"))
    marks = [e for e in timeline["traceEvents"] if e["ph"] == "i"]
    kinds = [e["name"].split()[0] for e in marks]
    assert sorted(set(kinds)) == ["near_limit", "needs_login", "retry"]
    assert kinds.count("retry") >= 4
    [login] = [e for e in marks if e["name"].startswith("needs_login")]
    assert login["args"] == {"account": "login"}
    assert all(e["s"] == "p" and e["ts"] >= 0 for e in marks)
