"""A trace whose run has a relative ``cwd``: one line naming it on either engine, no traceback.

The supervisor records a run's directory resolved (absolute); a relative one
in a trace was written by hand or by another tool, and would mean another
directory wherever it is replayed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sim_workloads import herdsman

TRACE = """\
{"herdsman_trace":1,"started_at":"2026-11-29T12:00:00.000000Z","config":{"providers":{"demo":{"exec":["true"],"concurrency":1}}}}
{"t":0.5,"seq":0,"event":"submit","run":{"id":"r1","provider":"demo","cwd":"sub/dir"}}
{"t":0.6,"seq":1,"event":"start","run_id":"r1","account":null}
{"t":1.6,"seq":2,"event":"finish","run_id":"r1","outcome":"succeeded","exit_code":0}
"""


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_relative_cwd_is_a_one_line_error_naming_the_line(tmp_path: Path, engine: str) -> None:
    (tmp_path / "relative.jsonl").write_text(TRACE, encoding="utf-8")
    done = herdsman("sim", "replay", "relative.jsonl", "--engine", engine, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "herdsman: relative.jsonl:2: run.cwd: expected an absolute path, got 'sub/dir'\n"
    )
    assert done.stdout == ""


def test_an_absolute_cwd_replays(tmp_path: Path) -> None:
    (tmp_path / "absolute.jsonl").write_text(TRACE.replace("sub/dir", "/sub/dir"), "utf-8")
    done = herdsman("sim", "replay", "absolute.jsonl", "--engine", "fast", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"cwd":"/sub/dir"' in done.stdout
