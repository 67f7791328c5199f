"""A replay's run keeps its trio instruments in a plain dict.

trio asks its instruments' ``UserDict`` whether any instrument wants a hook
about twenty times a replayed run, each a Python call; the replay swaps in
a dict that answers without one (``herdsman.sim.trio_internals.plain_instruments``).
Instruments added during the replay are still called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio._core._run as trio_run
from sim_workloads import busy_trace

from herdsman.sim import replay as replay_module
from herdsman.sim.workload import config_from_trace, read_workload


class Rounds(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


def test_a_replay_runs_with_plain_instruments_that_still_call_their_hooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[type] = []
    rounds = Rounds()
    honest = replay_module.drive

    async def drive(*args: Any, **kwargs: Any) -> None:
        seen.append(type(trio_run.GLOBAL_RUN_CONTEXT.runner.instruments))
        trio.lowlevel.add_instrument(rounds)
        await honest(*args, **kwargs)
        trio.lowlevel.remove_instrument(rounds)

    monkeypatch.setattr(replay_module, "drive", drive)
    workload = read_workload(busy_trace(tmp_path / "busy.jsonl", runs=20))
    replay_module.replay(workload, config_from_trace(workload.header.config, "header"))
    assert len(seen) == 1
    assert issubclass(seen[0], dict)
    assert rounds.count >= 20
