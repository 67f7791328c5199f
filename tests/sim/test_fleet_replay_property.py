"""Any fleet the simulator runs, its members' traces replayed together, gives their decisions.

The fleet fuzzer's harness (``herdsman.sim.fuzz.fleet_harness``) runs real
supervisors as members of one simulated ledger; without its faults (no
member killed, none cut off) each member's trace, with the header a real
member writes, must replay together with the others' to the same
decisions, whatever the scenario: runs on hot conversations submitted to
any member, claims refused and parked, fleet-wide caps, cancels asked
through any member.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json
from herdsman.sim.decisions import timeline_of
from herdsman.sim.diff import first_divergence, report
from herdsman.sim.fleet_replay import fleet_replay, read_member
from herdsman.sim.fuzz.fleet_harness import run_fleet_scenario
from herdsman.sim.fuzz.fleet_scenario import draw_fleet_scenario
from herdsman.sim.workload import config_from_trace
from herdsman.trace import read_trace_text


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10_000), members=st.integers(2, 3))
def test_a_simulated_fleet_replays_together_with_every_member_s_decisions(
    tmp_path_factory: pytest.TempPathFactory, seed: int, members: int
) -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    scenario = attrs.evolve(draw_fleet_scenario(seed, members=members), kill=None, partition=None)
    verdict = run_fleet_scenario(scenario)
    assert not verdict.failed, verdict.violations
    folder = tmp_path_factory.mktemp("fleet")
    paths = []
    for index, text in enumerate(verdict.traces):
        header, *events = text.splitlines()
        first = json.loads(header)
        loaded = load_config_text(scenario.config(index), Path("member.toml"), environ={})
        # What a real member's header holds: its configuration.
        first["config"] = config_as_json(loaded.config)
        path = folder / f"member-{index}.jsonl"
        path.write_text("\n".join([json.dumps(first), *events]) + "\n", encoding="utf-8")
        paths.append(path)
    replayed = fleet_replay(
        [read_member(path) for path in paths],
        [
            config_from_trace(json.loads(path.read_text().splitlines()[0])["config"], "c")
            for path in paths
        ],
    )
    assert replayed.notes == ()
    for path, recorded, text in zip(paths, verdict.traces, replayed.traces, strict=True):
        expected = timeline_of(read_trace_text(recorded, path.name)[1])
        got = timeline_of(read_trace_text(text, f"{path.name} (replayed)")[1])
        divergence = first_divergence(expected, got)
        assert divergence is None, report(divergence, expected, got, (path.name, "replay"))
