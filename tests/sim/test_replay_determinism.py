"""The same trace, configuration and seed give byte-identical output, in any process."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sim_workloads import busy_trace

from herdsman.sim.decisions import read_decisions, timeline_of
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload
from herdsman.trace import read_trace_text


def replay_in_a_process(trace: Path, out: Path, *, hash_seed: str, seed: int) -> bytes:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "herdsman",
            "sim",
            "replay",
            str(trace),
            "--seed",
            str(seed),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "replayed 120 runs" in result.stderr
    return out.read_bytes()


@pytest.mark.slow
def test_separate_processes_with_other_hash_seeds_and_wake_orders_agree_byte_for_byte(
    tmp_path: Path,
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl")
    outputs = {
        (hash_seed, seed): replay_in_a_process(
            trace, tmp_path / f"out-{hash_seed}-{seed}.jsonl", hash_seed=hash_seed, seed=seed
        )
        for hash_seed, seed in (("0", 1), ("1", 2), ("4242", 3), ("random", 99))
    }
    first = next(iter(outputs.values()))
    assert all(output == first for output in outputs.values())
    # And the workload was worth replaying: every rule had something to do.
    kinds = [json.loads(line)["event"] for line in first.decode().splitlines()[1:]]
    for kind in ("start", "finish", "usage_limit", "cancel", "reload", "submit"):
        assert kind in kinds, kind


@pytest.mark.slow
def test_replaying_in_one_process_with_many_seeds_never_changes_a_decision(
    tmp_path: Path,
) -> None:
    workload = read_workload(busy_trace(tmp_path / "busy.jsonl", runs=60))
    loaded = config_from_trace(workload.header.config, "header")
    expected = replay(workload, loaded, seed=0).trace
    for seed in range(1, 6):
        assert replay(workload, loaded, seed=seed).trace == expected, seed


def test_a_replay_of_a_replay_decides_the_same(tmp_path: Path) -> None:
    workload = read_workload(busy_trace(tmp_path / "busy.jsonl", runs=60))
    loaded = config_from_trace(workload.header.config, "header")
    once = tmp_path / "once.jsonl"
    once.write_text(replay(workload, loaded).trace)
    twice = tmp_path / "twice.jsonl"
    again = read_workload(once)
    twice.write_text(replay(again, config_from_trace(again.header.config, "h")).trace)
    a, b = read_decisions(once), read_decisions(twice)
    assert [d.describe() for d in a.decisions] == [d.describe() for d in b.decisions]


def test_a_run_freed_by_an_accounts_rest_ending_starts_then_not_at_the_next_arrival(
    tmp_path: Path,
) -> None:
    from sim_workloads import config_json

    config = config_json(
        '[supervisor]\nstate_dir = "/s"\n[providers.p]\nexec = ["x"]\n'
        '[[providers.p.accounts]]\nname = "a"\nwindow = "1h"\n'
    )
    lines = [
        {"herdsman_trace": 1, "started_at": "2026-11-29T00:00:00.000000Z", "config": config},
        {
            "t": 0.0,
            "seq": 0,
            "event": "submit",
            "run": {"id": "r1", "provider": "p"},
            "duration": 10.0,
            "outcome": "usage_limited",
        },
        {
            "t": 9000.0,
            "seq": 1,
            "event": "submit",
            "run": {"id": "r2", "provider": "p"},
            "duration": 10.0,
            "outcome": "succeeded",
        },
    ]
    trace = tmp_path / "rest.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    workload = read_workload(trace)
    out = replay(workload, config_from_trace(workload.header.config, "h")).trace
    events = [json.loads(line) for line in out.splitlines()[1:]]
    starts = [(e["t"], e["run_id"]) for e in events if e["event"] == "start"]
    # The limit at t=10 rests the account for its window (1h); r1 goes again
    # when the rest ends, and is done long before r2 arrives.
    assert starts == [(0.0, "r1"), (3610.0, "r1"), (9000.0, "r2")]
    ends = [(e["t"], e["run_id"]) for e in events if e["event"] == "finish"]
    assert ends == [(10.0, "r1"), (3620.0, "r1"), (9010.0, "r2")]


@pytest.mark.parametrize("micro", [1, 123457, 654321, 999999])
@pytest.mark.parametrize("quiet_at", [66.0, 76.8, 90.3, 95.7])
def test_a_run_waiting_for_a_rest_starts_even_when_the_input_ends_during_the_rest(
    tmp_path: Path, micro: int, quiet_at: float
) -> None:
    # The last input (a rejected reload) wakes no one; the rest then ends a
    # hair of float rounding away from where the wall clock says it does.
    # The replay must run the dispatcher's own timer, not stop with r1 queued.
    from sim_workloads import config_json

    config = config_json('[supervisor]\nstate_dir = "/s"\n[providers.p]\nexec = ["x"]\n')
    started_at = f"2026-11-29T12:00:00.{micro:06d}Z"
    header = {"herdsman_trace": 1, "started_at": started_at}
    until = dt.datetime.fromisoformat(started_at).timestamp() + 100.37
    run = {"id": "r1", "provider": "p", "workspace": "default"}
    lines = [
        {**header, "config": config},
        {"t": 0.0, "seq": 0, "event": "submit", "run": run},
        {"t": 0.0, "seq": 1, "event": "start", "run_id": "r1", "account": None},
        {"t": 5.0, "seq": 2, "event": "usage_limit", "run_id": "r1", "provider": "p"}
        | {"account": None, "until": until},
        {"t": 5.0, "seq": 3, "event": "finish", "run_id": "r1", "outcome": "usage_limited"}
        | {"exit_code": 1, "requeued": True},
        {"t": quiet_at, "seq": 4, "event": "reload_rejected", "errors": ["x: bad"]},
        {"t": 100.37, "seq": 5, "event": "start", "run_id": "r1", "account": None},
        {"t": 110.0, "seq": 6, "event": "finish", "run_id": "r1", "outcome": "succeeded"},
    ]
    trace = tmp_path / "rest.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    workload = read_workload(trace)
    result = replay(workload, config_from_trace(workload.header.config, "h"))
    assert result.left_queued == 0
    assert [d.kind for d in timeline_of(read_trace_text(result.trace, "out")[1]).decisions] == [
        "start",
        "usage_limit",
        "finish",
        "start",
        "finish",
    ]
