"""A replay collects the youngest generation rarely, and gives the process its thresholds back.

What the default thresholds cost a long replay (full collections of every
live object, none of them garbage) is in docs/simulator.md.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from sim_workloads import busy_trace

from herdsman.runtime.store import MemoryStore, NewRun, RunRecord
from herdsman.sim.collector import YOUNG_COLLECTIONS_RARER, young_collections_rarer
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload


class Watching(MemoryStore):
    """An in-memory ledger that notes the collector's thresholds at every submit."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, int, int]] = set()

    def submit(self, new: NewRun, now: float) -> tuple[RunRecord, bool]:
        self.seen.add(gc.get_threshold())
        return super().submit(new, now)


def test_a_replay_collects_the_young_generation_rarely(
    tmp_path: Path, thresholds: tuple[int, int, int]
) -> None:
    workload = read_workload(busy_trace(tmp_path / "busy.jsonl", runs=20))
    store = Watching()
    replay(workload, config_from_trace(workload.header.config, "header"), store=store)
    assert store.seen == {(500 * YOUNG_COLLECTIONS_RARER, 7, 9)}
    assert gc.get_threshold() == thresholds


def test_the_thresholds_come_back_when_the_replay_fails(thresholds: tuple[int, int, int]) -> None:
    seen = []

    def failing() -> None:
        with young_collections_rarer():
            seen.append(gc.get_threshold())
            raise KeyError("failed")

    with pytest.raises(KeyError):
        failing()
    assert seen == [(500 * YOUNG_COLLECTIONS_RARER, 7, 9)]
    assert gc.get_threshold() == thresholds
