"""The fast engine against Erlang C: the table in docs/capacity-planning.md.

For c in {1, 2, 4, 8, 16} slots and utilisation 0.5 to 0.9, simulates an
M/M/c queue (Poisson arrivals, exponential durations, every run on a lane
of its own) with the fast engine and prints, as a Markdown table, the
simulated and the predicted probability of waiting and mean wait, and their
relative errors. Seeded: the same table every time. Takes a few minutes.

    .venv/bin/python sim/erlang_c_table.py [--runs 1000000] [--seed 1]
"""

from __future__ import annotations

import argparse
import sys
import time

from herdsman.sim.queueing import measure_mmc

SERVERS = (1, 2, 4, 8, 16)
UTILISATIONS = (0.5, 0.6, 0.7, 0.8, 0.9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=1_000_000, help="runs per row at utilisation 0.8 and above"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(
        "| c | utilisation | runs | P(wait) simulated | Erlang C | error"
        " | mean wait simulated | Erlang C | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    began = time.perf_counter()
    for servers in SERVERS:
        for utilisation in UTILISATIONS:
            # Lighter loads settle sooner: fewer runs give the same precision.
            runs = args.runs if utilisation >= 0.8 else args.runs // 2
            m = measure_mmc(servers, utilisation, runs, seed=args.seed)
            worst = max(worst, abs(m.wait_error), abs(m.share_error))
            print(
                f"| {servers} | {utilisation:.1f} | {runs:,} | {m.waiting_share:.4f}"
                f" | {m.expected_share:.4f} | {m.share_error:+.2%} | {m.mean_wait:.4f}"
                f" | {m.expected_wait:.4f} | {m.wait_error:+.2%} |",
                flush=True,
            )
    print(
        f"\nworst relative error {worst:.2%}; mean duration 1 s; seed {args.seed};"
        f" {time.perf_counter() - began:.0f} s wall",
    )
    return 0 if worst <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
