"""Draw the pictures of docs/capacity-planning.md, and print the tables beside them.

Runs the real CLI, as the page does: a workload drawn like the sample day of
sim/team-day.jsonl, then ``herdsman sim plan --replications auto --plot``
for one varied key (the README's example), for two (slots and accounts,
priced), and for the same with what the agents spend. Seeded: the same
pictures and tables every time, on any machine and with any ``--workers``.

    .venv/bin/python sim/plan_pictures.py      # writes docs/images/plan-*.png
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "docs" / "images"
DAY = str(ROOT / "sim" / "team-day.jsonl")


def herdsman(*args: str) -> str:
    """``herdsman ARGS`` from the repository's root; its standard output."""
    done = subprocess.run(
        [sys.executable, "-m", "herdsman", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode not in (0, 1):
        sys.exit(f"herdsman {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


def main() -> int:
    IMAGES.mkdir(exist_ok=True)
    resampled = ["--arrivals", f"recorded:{DAY}", "--durations", f"empirical:{DAY}"]
    with tempfile.TemporaryDirectory(prefix="plan-pictures-") as directory:
        short = str(Path(directory) / "w.jsonl")
        day = str(Path(directory) / "day.jsonl")
        # The README's example, as it reads there.
        herdsman("sim", "generate", *resampled, "--span", "2h", "--out", short)
        one_key = [
            "sim", "plan", short, "--vary", "providers.claude.concurrency=1..3",
            "--slo", "p95_wait<=10m", "--replications", "auto",
            "--plot", str(IMAGES / "plan-one-key.png"),
        ]  # fmt: skip
        print(herdsman(*one_key))
        # docs/capacity-planning.md's example: a day of Claude conversations
        # under a global cap of 10, slots and accounts varied and priced.
        draw_day = [
            "sim", "generate", *resampled, "--span", "8h", "--turns", "1.5", "--think", "5m",
            "--providers", "claude=1", "--set", "supervisor.max_concurrency=10", "--seed", "1",
            "--out", day,
        ]  # fmt: skip
        herdsman(*draw_day)
        two_keys = [
            "sim", "plan", day, "--vary", "providers.claude.concurrency=1..4",
            "--vary", "providers.claude.accounts=1,2", "--slo", "p95_wait<=15m",
            "--replications", "auto", "--cost", "providers.claude.concurrency=40",
            "--cost", "providers.claude.accounts=200",
            "--plot", str(IMAGES / "plan-two-keys.png"),
        ]  # fmt: skip
        print(herdsman(*two_keys))
        # Its "What the agents spend": the same day with a spend model.
        spend_day = str(Path(directory) / "day-spend.jsonl")
        draw_spend = [
            *draw_day[:-2],
            "--tokens", "claude=input:25k,cache_read:600k,cache_write:40k,output:9k,sigma:0.5",
            "--token-prices", "claude=input:3,cache_read:0.3,cache_write:3.75,output:15",
            "--failures", "overloaded=0.03,rate_limit=0.01,crash=0.005",
            "--out", spend_day,
        ]  # fmt: skip
        herdsman(*draw_spend)
        spend = [
            "sim", "plan", spend_day, "--vary", "providers.claude.concurrency=1..4",
            "--vary", "providers.claude.accounts=1,2", "--slo", "p95_wait<=15m,spend_per_day<=$75",
            "--replications", "auto", "--cost", "providers.claude.concurrency=40",
            "--cost", "providers.claude.accounts=200",
            "--plot", str(IMAGES / "plan-spend.png"),
        ]  # fmt: skip
        print(herdsman(*spend))
    return 0


if __name__ == "__main__":
    sys.exit(main())
