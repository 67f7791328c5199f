"""On the inline ledger a submit and a finish wait for nothing, and make no coroutine to do so.

The simulator's ledger applies every call at once: by the time the
supervisor would wait for a submit's or a finish's result (``Ledger.result``,
``Ledger.settled``) the result is there. The supervisor reads it then
instead of awaiting a coroutine that returns it. Only the rarer calls
(start-up, the prune loop, the shutdown's trace line) still go through
``Ledger.call``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import config_json

from herdsman.runtime.ledger import Ledger
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload

CONFIG = """\
[supervisor]
state_dir = "/sim/state"

[providers.claude]
exec = ["claude", "-p"]
concurrency = 2
"""
RUNS = 30


def plain_trace(path: Path) -> Path:
    header = {"herdsman_trace": 1, "started_at": "2026-11-29T12:00:00.000000Z"}
    lines: list[dict[str, Any]] = [{**header, "config": config_json(CONFIG)}]
    for n in range(RUNS):
        run = {"id": f"r{n:03d}", "provider": "claude", "workspace": "default"}
        lines.append(
            {"t": n * 0.5, "seq": n, "event": "submit", "run": run, "duration": 1.5}
            | {"outcome": "succeeded"}
        )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_submits_and_finishes_await_no_result_already_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[str] = []
    for name in ("result", "settled"):
        honest = getattr(Ledger, name)

        async def counted(
            self: Ledger, pending: Any, *, honest: Any = honest, name: str = name
        ) -> Any:
            waits.append(name)
            return await honest(self, pending)

        monkeypatch.setattr(Ledger, name, counted)
    workload = read_workload(plain_trace(tmp_path / "plain.jsonl"))
    result = replay(workload, config_from_trace(workload.header.config, "header"))
    assert result.trace.count('"event":"finish"') == RUNS
    # A few calls of start-up and shutdown; none per run.
    assert len(waits) < 10, waits
