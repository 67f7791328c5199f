"""``sim plan`` of a workload whose model resamples a recorded trace it cannot find again."""

from __future__ import annotations

from pathlib import Path

from sim_workloads import busy_trace, herdsman


def test_a_resampled_trace_missing_where_the_plan_runs_names_why_it_is_read_and_where(
    tmp_path: Path,
) -> None:
    made, elsewhere = tmp_path / "made", tmp_path / "elsewhere"
    made.mkdir()
    elsewhere.mkdir()
    busy_trace(made / "busy.jsonl", runs=20)
    drawn = herdsman(
        "sim", "generate", "--arrivals", "recorded:busy.jsonl", "--durations",
        "empirical:busy.jsonl", "--span", "30m", "--out", "day.jsonl", cwd=made,
    )  # fmt: skip
    assert drawn.returncode == 0, drawn.stderr
    plan = ["sim", "plan", str(made / "day.jsonl"), "--vary", "supervisor.max_concurrency=1"]
    plan += ["--slo", "p95_wait<=1h", "--replications", "2", "--workers", "1"]
    lost = herdsman(*plan, cwd=elsewhere)
    assert lost.returncode == 2
    assert lost.stderr == (
        f"herdsman: {made / 'day.jsonl'}:1: its model resamples busy.jsonl, read again to draw"
        " each replication: busy.jsonl: cannot read trace: No such file or directory;"
        f" busy.jsonl is read from the folder sim plan runs in ({elsewhere}): run sim plan in"
        " the folder sim generate ran in\n"
    )
    # Where sim generate ran, the plan reads it.
    assert herdsman(*plan, cwd=made).returncode == 0
