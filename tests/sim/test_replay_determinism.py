"""The same trace, configuration and seed give byte-identical output, in any process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sim_workloads import busy_trace

from herdsman.sim.decisions import read_decisions
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload


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
