"""``herdsman sim fuzz --fleet MEMBERS``: fleet scenarios, one member killed in each (D5)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

__all__ = ["fuzz_fleet"]


def fuzz_fleet(args: argparse.Namespace, default_budget: int) -> int:
    """Run the fleet scenarios of seeds ``--seed``.. one after another; 1 if one broke."""
    refused = [
        flag
        for flag, given in (
            ("--workers", args.workers != 1),
            ("--budget", args.budget != default_budget),
            ("--out", args.out is not None),
        )
        if given
    ]
    if refused:
        print(
            f"herdsman: sim fuzz --fleet runs its seeds in one process and writes no case"
            f" file: leave out {', '.join(refused)}",
            file=sys.stderr,
        )
        return 2
    from herdsman.sim.fuzz.fleet_harness import run_fleet_scenario  # noqa: PLC0415
    from herdsman.sim.fuzz.fleet_scenario import draw_fleet_scenario  # noqa: PLC0415

    # The members' own logs, critical ones too (a fence fell, a lease expired),
    # are the faults at work; the verdict is the news.
    logging.getLogger("herdsman").setLevel(logging.CRITICAL + 1)
    began = time.perf_counter()
    first, members = args.seed, args.fleet
    runs = lost = seeds = 0
    simulated = 0.0
    for seed in range(first, first + args.seeds):
        verdict = run_fleet_scenario(draw_fleet_scenario(seed, members=members))
        seeds += 1
        runs += len(verdict.scenario.runs)
        lost += sum(1 for _, status, _ in verdict.ledger if status == "lost")
        simulated += verdict.span
        if verdict.failed:
            return _finding(args, seed, verdict.violations[0], seeds)
    elapsed = time.perf_counter() - began
    span = f"seed {first}" if seeds == 1 else f"seeds {first}..{first + seeds - 1}"
    line = (
        f"fuzzed fleet {span} ({members} members, one killed in each): {runs} runs,"
        f" {lost} lost to the faults, {simulated / 3600:.1f} simulated hours in"
        f" {elapsed:.1f} s wall; every invariant held"
    )
    _say(args, line, {"seeds": seeds, "members": members, "runs": runs, "lost": lost, "held": True})
    return 0


def _finding(args: argparse.Namespace, seed: int, violation: Any, seeds: int) -> int:
    command = f"herdsman sim fuzz --fleet {args.fleet} --seeds 1 --seed {seed}"
    line = (
        f"fleet seed {seed} broke an invariant after {seeds - 1} seed(s) that held:\n"
        f"  {violation}\nreproduce: {command}"
    )
    document = {
        "seeds": seeds,
        "members": args.fleet,
        "held": False,
        "finding": {
            "seed": seed,
            "violation": {"kind": violation.kind, "t": violation.t, "message": violation.message},
            "reproduce": command,
        },
    }
    _say(args, line, document)
    return 1


def _say(args: argparse.Namespace, line: str, document: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(line, flush=True)
