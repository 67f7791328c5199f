"""The replay's summary line: its moments alike, and the span a cut recording stands for."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import config_json

from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.result import ReplayResult, recording_ends, summary
from herdsman.sim.workload import config_from_trace, read_workload

CONFIG = """\
[supervisor]
state_dir = "/s"
[providers.agent]
exec = ["x"]
concurrency = 2
"""


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def test_every_moment_in_the_summary_is_printed_to_the_millisecond() -> None:
    # :g printed t=14.9566 beside t=42.894, and t=1.2 for t=1.200.
    result = ReplayResult(
        "",
        3,
        50.0,
        1.0,
        (),
        left_queued=1,
        rotated_at=14.95661,
        shutdown_at=42.894,
        unheld=(("b", 1.2),),
        unclassed=(("r", 3.0),),
    )
    line = summary(result)
    for moment in ("t=14.957:", "shutdown at t=42.894 stopped", "from t=1.200)", "r's at t=3.000)"):
        assert moment in line
    cut = summary(ReplayResult("", 1, 0.163, 1.0, (), cut_at=0.16342))
    assert "the recording ends at t=0.163 with runs still running" in cut


def killed(path: Path) -> Path:
    """A restarted supervisor's file: a run carried over at t=0, started at 0.163, killed.

    Its start does not say when it was decided (a trace written before
    ``decided``): a replay starts it at its submit.
    """
    header = {
        "herdsman_trace": 1,
        "started_at": "2026-12-02T08:00:00.000000Z",
        "config": config_json(CONFIG),
    }
    run = {"id": "r1", "provider": "agent", "conversation": "c1"}
    events: list[dict[str, Any]] = [
        {"t": 0.0, "event": "submit", "run": run, "carried": True},
        {"t": 0.163421, "event": "start", "run_id": "r1", "account": None},
    ]
    lines = [header] + [{"t": e["t"], "seq": n, **e} for n, e in enumerate(events)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_killed_recording_s_replay_spans_it_to_its_last_event(
    tmp_path: Path, engine: str
) -> None:
    # The replay starts r1 at its submit, at t=0, and it never ends: its
    # clock stops there, though the recording went on to 0.163.
    trace = killed(tmp_path / "killed.jsonl")
    workload = read_workload(trace)
    loaded = config_from_trace(workload.header.config, str(trace))
    if engine == "fast":
        result = recording_ends(fast_replay(workload, loaded), workload)
    else:
        result = replay(workload, loaded)
    assert result.span == 0.163421
    line = summary(result)
    assert " over 0.2 simulated seconds " in line
    assert "the recording ends at t=0.163 with runs still running" in line
