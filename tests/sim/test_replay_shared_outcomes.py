"""Runs that end alike share one outcome in the fake runner.

The fake runner hands every run that ends on its own in the same way one
frozen ``ProcessOutcome``. The supervisor works out each finish's fields
from it as from any outcome: each run gets its own log path, and the ledger
records what it always did.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sim_workloads import busy_trace

from herdsman.runtime.store import MemoryStore, RunStatus
from herdsman.runtime.supervisor import execution
from herdsman.runtime.supervisor.outcomes import finish_fields
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload


def test_runs_ending_alike_share_their_outcome_but_not_their_log_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes: list[object] = []
    honest = finish_fields

    def seen(ended: Any, log_path: str) -> Any:
        outcomes.append(ended)
        return honest(ended, log_path)

    # Where the supervisor looks it up.
    monkeypatch.setattr(execution, "finish_fields", seen)
    workload = read_workload(busy_trace(tmp_path / "busy.jsonl", runs=40))
    store = MemoryStore()
    result = replay(workload, config_from_trace(workload.header.config, "header"), store=store)
    finishes = result.trace.count('"event":"finish"')
    assert finishes >= 40
    # One outcome object for each way of ending, however many runs end so.
    assert len(outcomes) == finishes
    assert len({id(ended) for ended in outcomes}) < finishes / 2
    records = store.list_runs()
    assert len(records) == 40
    started = [r for r in records if r.started_at is not None]
    assert len(started) > 30
    for record in started:
        assert record.log_path is not None
        assert record.log_path.endswith(f"/logs/{record.id}.log")
    succeeded = [r for r in records if r.status is RunStatus.SUCCEEDED]
    assert succeeded
    assert all(r.result == "(simulated)" and r.exit_code == 0 for r in succeeded)
