"""A file begun by rotation replays on its own; diff compares a rotated-away one fairly."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pytest

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json
from herdsman.sim.decisions import Decision, Timeline, read_decisions
from herdsman.sim.diff import first_divergence
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload
from herdsman.trace import TraceWriter

EPOCH = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)


class Recording:
    """A TraceWriter on a hand-moved clock: what a supervisor would have written."""

    def __init__(self, folder: Path, config_text: str) -> None:
        self.t = 0.0
        self.folder = folder
        loaded = load_config_text(config_text, Path("/sim/supervisor.toml"), environ={})
        self.writer = TraceWriter(
            folder,
            max_bytes=1 << 40,
            config=config_as_json(loaded.config),
            clock=lambda: self.t,
            wall=lambda: EPOCH + dt.timedelta(seconds=self.t),
        )
        self.writer.open()

    def event(self, t: float, kind: str, **fields: Any) -> None:
        self.t = t
        self.writer.event(kind, **fields)

    def rotate(self, t: float) -> None:
        self.t = t
        self.writer.rotate()

    def files(self) -> list[Path]:
        self.writer.close()
        paths = self.folder.glob("trace-*.jsonl")
        return sorted(paths, key=lambda path: int(path.stem.rsplit("-", 1)[1]))


def replayed(recorded: Path, tmp_path: Path) -> Path:
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    workload = read_workload(recorded)
    result = replay(workload, config_from_trace(workload.header.config, "header"))
    out = tmp_path / f"replayed-{recorded.name}"
    out.write_text(result.trace)
    return out


def starts(path: Path) -> list[tuple[str, object, float]]:
    return [
        (d.run_id, dict(d.what)["account"], d.t)
        for d in read_decisions(path).decisions
        if d.kind == "start"
    ]


def run(run_id: str, **fields: str) -> dict[str, str]:
    return {"id": run_id, "provider": "p", "workspace": "default", **fields}


TWO_ACCOUNTS = """
[supervisor]
state_dir = "/sim/state"
[providers.p]
exec = ["p"]
concurrency = 2
[[providers.p.accounts]]
name = "a"
concurrency = 1
[[providers.p.accounts]]
name = "b"
concurrency = 1
"""


def test_a_run_running_at_the_rotation_goes_on_on_its_account(tmp_path: Path) -> None:
    rec = Recording(tmp_path / "traces", TWO_ACCOUNTS)
    rec.event(0.0, "submit", run=run("r1", conversation="x"))
    rec.event(0.0, "start", run_id="r1", account="a")
    rec.event(0.0, "submit", run=run("r2", conversation="y"))
    rec.event(0.0, "start", run_id="r2", account="b")
    rec.event(5.0, "finish", run_id="r1", outcome="succeeded", exit_code=0)
    rec.rotate(6.0)  # r2 runs on b; a is free and would be picked first
    rec.event(8.0, "finish", run_id="r2", outcome="succeeded", exit_code=0)
    _, second = rec.files()
    out = replayed(second, tmp_path)
    assert starts(out) == [("r2", "b", 0.0)]
    assert first_divergence(read_decisions(second), read_decisions(out)) is None


def test_an_account_resting_at_the_rotation_still_rests_in_the_next_file(tmp_path: Path) -> None:
    config = """
[supervisor]
state_dir = "/sim/state"
max_concurrency = 1
[providers.p]
exec = ["p"]
[providers.q]
exec = ["q"]
"""
    rec = Recording(tmp_path / "traces", config)
    until = EPOCH.timestamp() + 3600.0
    rec.event(0.0, "submit", run=run("r1"))
    rec.event(0.0, "start", run_id="r1", account=None)
    rec.event(10.0, "usage_limit", run_id="r1", provider="p", account=None, until=until)
    rec.event(10.0, "finish", run_id="r1", outcome="usage_limited", exit_code=1, requeued=True)
    rec.rotate(20.0)  # r1 queued, its account resting for another hour
    rec.event(20.0, "submit", run={"id": "r3", "provider": "q", "workspace": "default"})
    rec.event(20.0, "start", run_id="r3", account=None)
    rec.event(120.0, "finish", run_id="r3", outcome="succeeded", exit_code=0)
    rec.event(3600.0, "start", run_id="r1", account=None)
    rec.event(3700.0, "finish", run_id="r1", outcome="succeeded", exit_code=0)
    _, second = rec.files()
    assert read_workload(second).header.carry == {
        "running": [],
        "queued": [run("r1")],
        "rests": [{"provider": "p", "account": None, "until": until}],
    }
    out = replayed(second, tmp_path)
    assert [(r, t) for r, _, t in starts(out)] == [("r3", 0.0), ("r1", 3580.0)]
    assert first_divergence(read_decisions(second), read_decisions(out)) is None


def test_a_rest_ended_by_hand_is_replayed_and_not_carried(tmp_path: Path) -> None:
    config = '[supervisor]\nstate_dir = "/sim/state"\n[providers.p]\nexec = ["p"]\n'
    rec = Recording(tmp_path / "traces", config)
    until = EPOCH.timestamp() + 3600.0
    rec.event(0.0, "submit", run=run("r1"))
    rec.event(0.0, "start", run_id="r1", account=None)
    rec.event(10.0, "usage_limit", run_id="r1", provider="p", account=None, until=until)
    rec.event(10.0, "finish", run_id="r1", outcome="usage_limited", exit_code=1, requeued=True)
    rec.event(100.0, "rest_ended", provider="p", account=None)
    rec.event(100.0, "start", run_id="r1", account=None)
    rec.rotate(101.0)
    rec.event(110.0, "finish", run_id="r1", outcome="succeeded", exit_code=0)
    first, second = rec.files()
    carry = read_workload(second).header.carry
    assert carry is not None
    assert carry["rests"] == []
    out = replayed(first, tmp_path)
    assert [t for _, _, t in starts(out)] == [0.0, 100.0]
    assert first_divergence(read_decisions(first), read_decisions(out)) is None


def test_a_run_still_running_at_the_rotation_is_not_given_the_default_duration(
    tmp_path: Path,
) -> None:
    config = '[supervisor]\nstate_dir = "/sim/state"\n[providers.p]\nexec = ["p"]\n'
    rec = Recording(tmp_path / "traces", config + "concurrency = 1\n")
    rec.event(0.0, "submit", run=run("r1"))
    rec.event(0.0, "start", run_id="r1", account=None)
    rec.event(1.0, "submit", run=run("r2"))
    rec.rotate(200.0)  # r1 still running: the 60 s default would end it at t=60
    first, _ = rec.files()
    out = replayed(first, tmp_path)
    # r2 starts when r1 ends: at the rotation, not before.
    assert starts(out) == [("r1", None, 0.0), ("r2", None, 200.0)]
    assert first_divergence(read_decisions(first), read_decisions(out)) is None


def decision(kind: str, run_id: str, t: float) -> Decision:
    return Decision(kind, run_id, (), t, 1)


@pytest.mark.parametrize(
    ("later", "agree"),
    [
        ([], True),
        ([decision("start", "r2", 60.0)], False),  # decided well before the rotation
        ([decision("start", "r2", 199.8)], True),  # may be the next file's first start
        ([decision("finish", "r1", 250.0)], True),  # after the rotation: not compared
    ],
)
def test_diff_compares_a_rotated_recording_up_to_its_rotation(
    later: list[Decision], agree: bool
) -> None:
    recorded = Timeline((decision("start", "r1", 0.0),), {}, {}, rotated_at=200.0)
    replay_of_it = Timeline((decision("start", "r1", 0.0), *later), {}, {})
    assert (first_divergence(recorded, replay_of_it) is None) is agree
    assert (first_divergence(replay_of_it, recorded) is None) is agree


def test_diff_still_sees_a_decision_the_replay_skipped_before_the_rotation() -> None:
    recorded = Timeline(
        (decision("start", "r1", 0.0), decision("start", "r2", 100.0)), {}, {}, rotated_at=200.0
    )
    replay_of_it = Timeline((decision("start", "r1", 0.0), decision("start", "r3", 199.9)), {}, {})
    divergence = first_divergence(recorded, replay_of_it)
    assert divergence is not None
    assert divergence.index == 1
