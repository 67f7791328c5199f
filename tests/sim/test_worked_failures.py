"""A synthetic attempt that failed after its agent worked is retried only as ``after_work`` says.

The workload's ``worked`` reaches the lifecycle through the runner's own
``ProcessOutcome.worked`` in both engines (``herdsman.sim.fake_end``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from sim_workloads import config_json

from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload_text
from herdsman.trace import TraceFormatError, read_trace_text

CONFIG = """\
[supervisor]
state_dir = "/sim/state"
[providers.claude]
exec = ["claude"]
concurrency = 4
protocol = "claude"
[providers.claude.retry]
attempts = 3
on = ["overloaded", "crash"]
after_work = [{after_work}]
backoff = "10s"
"""


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def _workload(after_work: str, **worked: Any) -> str:
    header = {
        "herdsman_trace": 1,
        "started_at": "2026-11-29T12:00:00.000000Z",
        "config": config_json(CONFIG.format(after_work=after_work)),
    }
    lines = [json.dumps(header)]
    for n, (failure, outcome) in enumerate([("overloaded", "failed"), ("crash", "failed")]):
        for did in (False, True):
            run_id = f"{failure}-{'worked' if did else 'idle'}"
            line = {
                "t": float(n),
                "seq": 0,
                "event": "submit",
                "run": {"id": run_id, "provider": "claude"},
                "duration": 30.0,
                "outcome": outcome,
                "failure": failure,
                **({"worked": did} | worked),
            }
            lines.append(json.dumps(line))
    return "\n".join(lines) + "\n"


def _retried(text: str) -> dict[str, list[str]]:
    """Each engine's retried runs, in the order retried; the engines must agree."""
    workload = read_workload_text(text, "w")
    loaded = config_from_trace(workload.header.config, "w")
    out = {}
    for name, result in (
        ("trio", replay(workload, loaded)),
        ("fast", fast_replay(workload, loaded)),
    ):
        _, events = read_trace_text(result.trace, name)
        out[name] = sorted({e.fields["run_id"] for e in events if e.event == "retry"})
    return out


def test_an_attempt_that_worked_is_retried_only_for_a_class_in_after_work() -> None:
    assert _retried(_workload("")) == {
        "trio": ["crash-idle", "overloaded-idle"],
        "fast": ["crash-idle", "overloaded-idle"],
    }
    both = ["crash-idle", "overloaded-idle", "overloaded-worked"]
    assert _retried(_workload('"overloaded"')) == {"trio": both, "fast": both}


def test_worked_must_be_true_or_false() -> None:
    with pytest.raises(TraceFormatError, match=r"worked: expected true or false, got 'yes'"):
        read_workload_text(_workload("", worked="yes"), "w")
