"""A trace recorded across worktree sweeps, replayed: the same decisions on both engines.

Recorded afresh by sim/record_sweeps.py's own ``record`` (the script that
made sim/sweeps-recorded.jsonl): ``herdsman run`` as a real process, a real
git repository, worktrees swept every second once idle, a clean one
removed, a dirty one kept, a submit waiting for a removal held open and a
skip meanwhile, and runs making their swept checkouts again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from herdsman.sim.decisions import read_decisions, timeline_of
from herdsman.sim.diff import first_divergence, report
from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload
from herdsman.trace import read_trace_text

SIM = Path(__file__).parents[3] / "sim"


def test_a_trace_recorded_across_sweeps_replays_with_its_decisions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SIM))
    from record_sweeps import record  # a script of sim/, not a package

    # It asserts itself that the sweeps removed c0's and c1's clean
    # worktrees, kept d0's dirty one, and that later runs made them again.
    record(tmp_path)
    [recorded] = (tmp_path / "state" / "traces").glob("*.jsonl")
    events = [json.loads(line) for line in recorded.read_text().splitlines()[1:]]
    kinds = [e["event"] for e in events]
    assert kinds.count("removal_wait") == 1
    assert kinds.count("skip") == 1
    assert kinds.index("removal_wait") < kinds.index("skip")

    logging.getLogger("herdsman").setLevel(logging.ERROR)
    workload = read_workload(recorded)
    loaded = config_from_trace(workload.header.config, str(recorded))
    expected = read_decisions(recorded)
    for name, result in (
        ("trio", replay(workload, loaded)),
        ("fast", fast_replay(workload, loaded)),
    ):
        replayed = timeline_of(read_trace_text(result.trace, name)[1])
        divergence = first_divergence(expected, replayed)
        assert divergence is None, report(divergence, expected, replayed, ("recorded", name))
        assert result.left_queued == 0
