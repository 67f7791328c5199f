"""The sample traces under sim/ replay to their golden outputs, byte for byte."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from herdsman.sim.decisions import read_decisions
from herdsman.sim.diff import first_divergence
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload

SIM = Path(__file__).parents[2] / "sim"


@pytest.mark.parametrize("name", ["demo-recorded", "team-day"])
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
