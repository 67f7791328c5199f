"""A fleet replay keeps what a synthetic run's later attempts spend."""

from __future__ import annotations

import json

from sim_workloads import config_json

from herdsman.sim.fleet_members import Member, _merged
from herdsman.sim.workload import read_workload_text


def test_a_synthetic_runs_later_attempts_spend_survive_the_merge() -> None:
    header = {"herdsman_trace": 1, "started_at": "2026-11-29T12:00:00.000000Z"}
    header["config"] = config_json()
    submit = {"t": 1.0, "seq": 0, "event": "submit", "duration": 30.0, "outcome": "failed"}
    submit["run"] = {"id": "r1", "provider": "claude"}
    submit["failure"] = "overloaded"
    submit["spend"] = {"tokens": {"input": 1000, "output": 200}, "cost_usd": 0.02}
    workload = read_workload_text(json.dumps(header) + "\n" + json.dumps(submit) + "\n", "m0")
    later = workload.plans["r1"].usage
    assert later is not None
    assert later.cost_usd == 0.02  # a retry spends again
    merged = _merged([Member("m0", workload, ())], [0.0])
    assert merged.plans["r1"].usage == later
    assert merged.plans["r1"].attempts == workload.plans["r1"].attempts
