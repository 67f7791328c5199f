"""The fast engine against Erlang C: the table in docs/capacity-planning.md.

For c in {1, 2, 4, 8, 16} slots and utilisation 0.5 to 0.9, simulates an
M/M/c queue (Poisson arrivals, exponential durations, every run on a lane
of its own) with the fast engine and prints, as a Markdown table, the
simulated and the predicted probability of waiting and mean wait, and their
relative errors. Seeded: the same table every time. Takes a quarter of
an hour (17.5 million simulated runs).

Then (``--part lanes``) the same arrivals at c = 4 and utilisation 0.7 put
on fewer and fewer conversations: where the formula stops holding.

    .venv/bin/python sim/erlang_c_table.py [--part all|erlang|lanes] [--runs 1000000] [--seed 1]
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
    parser.add_argument("--part", choices=("all", "erlang", "lanes"), default="all")
    args = parser.parse_args()
    worst = erlang_table(args.runs, args.seed) if args.part != "lanes" else 0.0
    if args.part != "erlang":
        lanes_table(args.runs // 5, args.seed)
    return 0 if worst <= 0.05 else 1


def erlang_table(runs_high: int, seed: int) -> float:
    """Simulated against predicted, every row; the worst relative error."""
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
            runs = runs_high if utilisation >= 0.8 else runs_high // 2
            m = measure_mmc(servers, utilisation, runs, seed=seed)
            worst = max(worst, abs(m.wait_error), abs(m.share_error))
            print(
                f"| {servers} | {utilisation:.1f} | {runs:,} | {m.waiting_share:.4f}"
                f" | {m.expected_share:.4f} | {m.share_error:+.2%} | {m.mean_wait:.4f}"
                f" | {m.expected_wait:.4f} | {m.wait_error:+.2%} |",
                flush=True,
            )
    print(
        f"\nworst relative error {worst:.2%}; mean duration 1 s; seed {seed};"
        f" {time.perf_counter() - began:.0f} s wall\n",
    )
    return worst


def lanes_table(runs: int, seed: int) -> None:
    """c = 4 at 0.7: the same arrivals on ever fewer conversations."""
    print(
        f"| conversations (c = 4, utilisation 0.7, {runs:,} runs) | P(wait) | Erlang C"
        " | mean wait | Erlang C |"
    )
    print("|---|---|---|---|---|")
    for conversations in (0, 1000, 100, 20, 8):
        m = measure_mmc(4, 0.7, runs, seed=seed, conversations=conversations)
        label = "every run its own lane" if not conversations else f"{conversations:,}"
        print(
            f"| {label} | {m.waiting_share:.4f} | {m.expected_share:.4f}"
            f" | {m.mean_wait:.4f} | {m.expected_wait:.4f} |",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
