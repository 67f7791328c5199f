"""The simulator never starts a fence keeper (docs/operations.md, "When the supervisor dies").

The keeper belongs to ``herdsman run``'s launch path (runtime/main.py's
``serve``), which the replay and the fuzzer do not take: they build the
supervisor themselves and spawn nothing. Checked from the outside, on the
real commands in processes of their own: not one of the modules that start
a keeper is even imported (Python's ``-X importtime`` lists every import).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sim_workloads import busy_trace

LAUNCH_PATH = {"herdsman.runtime.main", "herdsman.runtime.fence", "herdsman.runtime.sole_fence"}


def imported(*args: str, cwd: Path) -> set[str]:
    """The modules ``herdsman ARGS`` imports, run with ``-X importtime``; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "herdsman", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert done.returncode == 0, done.stderr
    return {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }


def test_a_replay_and_a_fuzz_seed_never_load_the_keeper_s_launch_path(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=20)
    replayed = imported("sim", "replay", str(trace), "--out", "out.jsonl", cwd=tmp_path)
    fuzzed = imported("sim", "fuzz", "--seeds", "1", "--budget", "0", cwd=tmp_path)
    # The probe sees the supervisor itself, so an empty answer is no pass.
    assert "herdsman.runtime.supervisor" in replayed
    assert "herdsman.runtime.supervisor" in fuzzed
    assert not LAUNCH_PATH & replayed
    assert not LAUNCH_PATH & fuzzed
