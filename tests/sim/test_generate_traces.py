"""``sim generate`` with a recorded trace it cannot read: the flag that names it is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_workloads import herdsman


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--arrivals", "recorded:nope.jsonl", "--durations", "exponential:5m"],
            "--arrivals recorded:nope.jsonl: nope.jsonl: cannot read trace: No such file or"
            " directory",
        ),
        (
            ["--arrivals", "poisson:3", "--durations", "empirical:notes.txt"],
            "--durations empirical:notes.txt: notes.txt:1: not JSON: Expecting value",
        ),
    ],
)
def test_a_recorded_trace_that_cannot_be_read_names_its_flag(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    (tmp_path / "notes.txt").write_text("not a trace\n")
    done = herdsman("sim", "generate", *flags, "--span", "1h", "--out", "day.jsonl", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"herdsman: {message}\n"
    assert not (tmp_path / "day.jsonl").exists()
