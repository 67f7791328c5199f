"""Instruction counts under valgrind's cachegrind: a load-independent cost per run.

Wall figures on a shared machine move by tens of percent from run to run;
the instructions a pass executes do not. A benchmark script that takes
``--child NAME --runs N --slots S`` (do pass NAME on N runs and exit) gets,
from :func:`instructions_per_run`, each pass's instructions per run: the
count at N runs less the count at N/3, over the runs between, so the
interpreter's start-up and the imports cancel out.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def instructions(script: str, name: str, runs: int, slots: int) -> int:
    """Instructions cachegrind counts for one pass of ``script --child name``, whole process."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "cachegrind.out"
        valgrind = ["valgrind", "--tool=cachegrind", "--cache-sim=no"]
        child = [sys.executable, script, "--child", name, f"--runs={runs}", f"--slots={slots}"]
        completed = subprocess.run(
            [*valgrind, f"--cachegrind-out-file={out}", *child],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        found = re.search(r"I\s+refs:\s+([\d,]+)", completed.stderr)
        if completed.returncode != 0 or found is None:
            raise SystemExit(f"cachegrind failed for {name}:\n{completed.stderr[-2000:]}")
        return int(found.group(1).replace(",", ""))


def instructions_per_run(
    script: str, names: Sequence[str], runs: int, slots: int, jobs: int
) -> tuple[int, dict[str, float]]:
    """Each pass's instructions per run: ``runs`` minus a third as many, so start-up cancels out.

    Returns the smaller run count and the figure of each name. Each count is
    a process of its own, so up to ``jobs`` of them run side by side.
    """
    small = runs // 3
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        counts = {
            (name, n): pool.submit(instructions, script, name, n, slots)
            for name in names
            for n in (runs, small)
        }
        return small, {
            name: (counts[name, runs].result() - counts[name, small].result()) / (runs - small)
            for name in names
        }
