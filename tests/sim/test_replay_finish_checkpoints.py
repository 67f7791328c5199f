"""A run's finish is recorded unshielded in the simulator only because it awaits nothing.

With the simulator's inline ledger the supervisor records a finish without
the shielded cancel scope production needs (nothing is awaited, so a
forced stop has nothing to interrupt). The claim is checked as it runs: a
finish that checkpoints there must fail the replay, not quietly become
cancellable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from sim_workloads import busy_trace

from herdsman.runtime.supervisor import Supervisor
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload


def _replay(trace: Path) -> str:
    workload = read_workload(trace)
    return replay(workload, config_from_trace(workload.header.config, "header")).trace


def test_a_finish_that_checkpoints_under_the_inline_ledger_fails_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=10)
    honest = Supervisor._record_finish

    async def checkpointing(self: Supervisor, record: Any, ended: Any, **options: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return await honest(self, record, ended, **options)

    monkeypatch.setattr(Supervisor, "_record_finish", checkpointing)
    with pytest.raises(ExceptionGroup) as raised:
        _replay(trace)
    # Raised in the run's task, through the supervisor's nurseries.
    assert raised.group_contains(AssertionError, match="block yielded", depth=None)


def test_the_same_replay_without_the_checkpoint_finishes_every_run(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=10)
    finishes = [line for line in _replay(trace).splitlines() if '"event":"finish"' in line]
    assert len(finishes) == 10
