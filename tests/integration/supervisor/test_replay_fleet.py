"""Three real fleet members' traces, replayed together: each member's decisions as recorded.

Recorded afresh by sim/record_fleet.py's own ``record`` (the script that made
sim/fleet-m*.jsonl): three ``herdsman run`` processes as fleet members on the
test's PostgreSQL schema, the demo agent, runs submitted to every member on
shared conversations, claims refused and runs parked, a skip decided
fleet-wide, a cancel asked through a member that had not polled the run, and
a drain of each. The replay puts the three supervisors on one simulated
ledger under one clock; ``sim diff`` of each member's recording against its
replay must agree on every decision.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from herdsman.sim.decisions import read_decisions, timeline_of
from herdsman.sim.diff import first_divergence, report
from herdsman.sim.fleet_replay import fleet_replay, read_member
from herdsman.sim.workload import config_from_trace
from herdsman.trace import read_trace, read_trace_text

SIM = Path(__file__).parents[3] / "sim"


def test_three_members_traces_replay_together_with_every_members_decisions(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SIM))
    from record_fleet import record  # a script of sim/, not a package

    # It asserts itself that the skip was skipped and the cancel cancelled.
    paths = record(tmp_path, postgres_url)
    kinds = [event.event for path in paths for event in read_trace(path)[1]]
    for kind in ("fleet_submit", "poll", "claim_refused", "skip", "start", "finish", "shutdown"):
        assert kind in kinds, kind
    assert "fleet_cancel" in kinds or "cancel" in kinds

    logging.getLogger("herdsman").setLevel(logging.ERROR)
    members = [read_member(path) for path in paths]
    configs = [config_from_trace(m.workload.header.config, m.name) for m in members]
    result = fleet_replay(members, configs)
    assert result.notes == ()
    starts = 0
    for path, text in zip(paths, result.traces, strict=True):
        expected = read_decisions(path)
        replayed = timeline_of(read_trace_text(text, f"{path.name} (replayed)")[1])
        divergence = first_divergence(expected, replayed)
        assert divergence is None, report(divergence, expected, replayed, (path.name, "replay"))
        starts += sum(1 for d in expected.decisions if d.kind == "start")
    assert starts == 12  # each of the 14 runs once, but the skipped and the cancelled one
