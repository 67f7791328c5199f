"""``herdsman sim diff`` given a workload, which holds no decisions, says so and what to compare."""

from __future__ import annotations

from pathlib import Path

from sim_workloads import busy_trace, herdsman


def _note(path: str) -> str:
    return (
        f"{path} is a workload, not a replay: its submits give each run's duration and"
        f" outcome, and it holds no decisions; replay it (herdsman sim replay {path}"
        " --out OUT) and compare OUT with another replay of it"
    )


def test_a_workload_diffed_against_its_replay_is_told_apart_from_a_divergence(
    tmp_path: Path,
) -> None:
    busy_trace(tmp_path / "busy.jsonl", runs=6)
    replay = herdsman("sim", "replay", "busy.jsonl", "--engine", "fast", "--out", "r.jsonl",
                      cwd=tmp_path)  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    against = herdsman("sim", "diff", "busy.jsonl", "r.jsonl", cwd=tmp_path)
    assert against.returncode == 1
    lines = against.stdout.splitlines()
    assert lines[0].startswith("the traces diverge at decision 0 ")
    assert lines[-1] == _note("busy.jsonl")
    # Two workloads "agree" on no decision: said, once for a file given twice.
    itself = herdsman("sim", "diff", "busy.jsonl", "busy.jsonl", cwd=tmp_path)
    assert itself.returncode == 0
    assert itself.stdout.splitlines() == [
        "the traces agree on all 0 decisions",
        _note("busy.jsonl"),
    ]
    # A replay's own diff is as it was.
    same = herdsman("sim", "diff", "r.jsonl", "r.jsonl", cwd=tmp_path)
    assert same.stdout.splitlines() == [same.stdout.splitlines()[0]]
    assert same.stdout.startswith("the traces agree on all ")
