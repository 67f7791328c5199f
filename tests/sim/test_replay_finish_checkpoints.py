"""Recording a run's finish on the replay's inline ledger reaches no checkpoint.

The replay's ledger applies every call at once, so recording a finish
awaits nothing: no scheduling round per finish, and nothing a forced stop
could interrupt. Production does not check this (it uses trio's public API
only, and its ledger waits for commits); the simulator's tests do, with
``trio.testing.assert_no_checkpoints`` around every finish of a replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from sim_workloads import busy_trace

from herdsman.runtime.supervisor.execution import Execution
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload


def _replay(trace: Path) -> str:
    workload = read_workload(trace)
    return replay(workload, config_from_trace(workload.header.config, "header")).trace


def _checked(record_finish: Any) -> Any:
    async def checked(self: Execution, record: Any, ended: Any, **options: Any) -> Any:
        with trio.testing.assert_no_checkpoints():
            return await record_finish(self, record, ended, **options)

    return checked


def test_every_finish_of_a_replay_is_recorded_without_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=10)
    monkeypatch.setattr(Execution, "_record_finish", _checked(Execution._record_finish))
    finishes = [line for line in _replay(trace).splitlines() if '"event":"finish"' in line]
    assert len(finishes) == 10


def test_a_finish_that_checkpoints_fails_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=10)
    honest = Execution._record_finish

    async def checkpointing(self: Execution, record: Any, ended: Any, **options: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return await honest(self, record, ended, **options)

    monkeypatch.setattr(Execution, "_record_finish", _checked(checkpointing))
    with pytest.raises(ExceptionGroup) as raised:
        _replay(trace)
    # Raised in the run's task, through the supervisor's nurseries.
    assert raised.group_contains(AssertionError, depth=None)
