"""Where a run's slot time goes in ``herdsman run``: one pass of runtime.py, step by step.

Runs ``benchmarks/runtime.py`` once with a debug-only hook in the supervisor
(``benchmarks/slot_timeline_hook/sitecustomize.py``, loaded through
``PYTHONPATH``; production code keeps no timing of its own) and prints, for
the runs submitted 50 per request, the time between consecutive steps of a
run's slot, p50, p90 and mean: its start queued in the ledger, the batch
holding it begins to commit in the ledger's thread, the commit ends, the
event loop settles the batch, the start's callback, the run's task begins,
the spawn job begins and ends in its thread, and the finish is recorded
(which frees the slot and queues the next start). Also how busy the commit
thread was, and the gap between one commit's end and the next one's start.

Run: python benchmarks/slot_timeline.py [--keep FILE] [runtime.py's options]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = (
    "queued",
    "commit_began",
    "commit_ended",
    "settling",
    "callback",
    "task",
    "spawn_began",
    "spawn_ended",
    "finish",
)


def quantile(values: list[float], q: float) -> float:
    """The value at quantile ``q`` of sorted ``values`` (nearest rank)."""
    return values[min(len(values) - 1, int(q * len(values)))]


def report(data: dict[str, object]) -> None:
    """Print the steps of the batched phase's runs (their ids start with "b")."""
    runs = data["runs"]
    assert isinstance(runs, dict)
    rows = [r for k, r in runs.items() if k.startswith("b") and all(s in r for s in STEPS)]
    if not rows:
        raise SystemExit("no run passed every step: did the hook load? (see its docstring)")
    print(f"{len(rows)} runs, 50 per request; ms between steps: p50, p90, mean")
    for before, after in itertools.pairwise(STEPS):
        times = sorted((r[after] - r[before]) * 1000 for r in rows)
        print(
            f"  {before:>12} -> {after:<12} {statistics.median(times):6.2f} "
            f"{quantile(times, 0.9):6.2f} {statistics.fmean(times):6.2f}"
        )
    total = sorted((r["finish"] - r["queued"]) * 1000 for r in rows)
    print(
        f"  {'queued':>12} -> {'finish':<12} {statistics.median(total):6.2f} "
        f"{quantile(total, 0.9):6.2f} {statistics.fmean(total):6.2f}"
    )
    first = min(r["queued"] for r in rows)
    last = max(r["finish"] for r in rows)
    batches = data["batches"]
    assert isinstance(batches, list)
    inside = [b for b in batches if first <= b[0] <= last]
    busy = sum(end - begin for begin, end, _ in inside) / (last - first)
    gaps = sorted((b[0] - a[1]) * 1000 for a, b in itertools.pairwise(inside))
    calls = statistics.fmean(n for _, _, n in inside)
    print(
        f"commit thread busy {busy:.0%} of the time; {calls:.1f} calls a batch; gap from a "
        f"commit's end to the next one's start: p50 {statistics.median(gaps):.2f} ms, "
        f"p90 {quantile(gaps, 0.9):.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="also keep the raw times in this JSON file")
    ours, theirs = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = ours.keep or Path(tmp) / "timeline.json"
        hook = str(HERE / "slot_timeline_hook")
        paths = [hook, *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(paths),
            "HERDSMAN_SLOT_TIMELINE": str(out),
        }
        subprocess.run([sys.executable, str(HERE / "runtime.py"), *theirs], env=env, check=True)
        report(json.loads(out.read_text()))


if __name__ == "__main__":
    main()
