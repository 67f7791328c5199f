"""``herdsman sim fuzz``, and ``herdsman sim replay`` of a case file it wrote."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from herdsman.sim.fuzz.scenario import scenario_from_json
from herdsman.trace import TraceHeader

__all__ = ["add_fuzz_command", "replay_case"]

#: What one minimisation may cost, in scenario runs.
DEFAULT_BUDGET = 200


def _whole(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {text!r}")
        return value

    return parse


def _fuzz(args: argparse.Namespace) -> int:
    from herdsman.sim.fuzz.campaign import (  # noqa: PLC0415 - pyfakefs is heavy
        fuzz_seeds,
        minimise,
        reproduce_command,
        write_case,
    )

    # The simulated supervisor's own logs (faults are its daily bread) are
    # not news for whoever fuzzes it: the verdict is.
    logging.getLogger("herdsman").setLevel(logging.CRITICAL)
    first = args.seed
    batch = fuzz_seeds(range(first, first + args.seeds))
    span = f"seed {first}" if args.seeds == 1 else f"seeds {first}..{first + args.seeds - 1}"
    failure = batch.failure
    if failure is None:
        print(
            f"fuzzed {span}: {batch.runs} runs, {batch.faults} faults,"
            f" {batch.simulated / 3600:.1f} simulated hours in {batch.wall:.1f} s wall;"
            " every invariant held"
        )
        return 0
    seed = failure.scenario.seed
    print(f"seed {seed} broke an invariant after {batch.seeds - 1} seed(s) that held:")
    print(f"  {failure.violations[0]}")
    print(f"reproduce: {reproduce_command(seed)}")
    out = args.out if args.out is not None else Path(f"herdsman-fuzz-{seed}.jsonl")
    if args.budget:
        smaller, found = minimise(failure, budget=args.budget)
        if not smaller.failed:  # cannot happen: ddmin keeps a failing subset
            smaller = failure
        note = "" if found.complete else f" (stopped at --budget {args.budget})"
        print(
            f"minimised to {len(smaller.scenario.events)} of {len(failure.scenario.events)}"
            f" events in {found.tries} runs{note}:"
        )
        print(f"  {smaller.violations[0]}")
        failure = smaller
    write_case(out, failure)
    print(f"wrote {out}; replay it: herdsman sim replay {out}")
    return 1


def replay_case(args: argparse.Namespace, header: TraceHeader) -> int:
    """``herdsman sim replay`` of a fuzz case file: run it again and say what broke."""
    from herdsman.sim.fuzz.harness import run_scenario  # noqa: PLC0415

    assert header.fuzz is not None
    refused = [
        flag
        for flag, given in (
            ("-c", args.config is not None),
            ("--set", bool(args.overrides)),
            ("--seed", args.seed is not None),
            ("--engine fast", args.engine == "fast"),
            ("--chrome-trace", args.chrome_trace is not None),
        )
        if given
    ]
    if refused:
        print(
            f"herdsman: {args.trace} is a fuzz case (it carries its configuration, seed and"
            f" faults): leave out {', '.join(refused)}",
            file=sys.stderr,
        )
        return 2
    logging.getLogger("herdsman").setLevel(logging.CRITICAL)
    scenario = scenario_from_json(header.fuzz, f"{args.trace}:1")
    verdict = run_scenario(scenario)
    # One trace per life of the supervisor: a crash starts the next.
    text = "".join(verdict.traces)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    what = f"fuzz case of seed {scenario.seed}, {len(scenario.events)} events"
    if verdict.failed:
        print(f"{what}: {verdict.violations[0]}", file=sys.stderr)
        return 1
    print(f"{what}: every invariant held", file=sys.stderr)
    return 0


def add_fuzz_command(actions: Any, guarded: Callable[[Any], Any]) -> None:
    """Add ``sim fuzz`` to the ``sim`` subcommands."""
    fuzz = actions.add_parser(
        "fuzz",
        help="run seeded faults through the whole supervisor, checking invariants"
        " (see docs/simulator.md)",
        description="Run seeded faults (crashes, hangs, usage limits, git and disk failures,"
        " restarts, cancellations, bad reloads) through the whole supervisor and check its"
        " invariants after every event. A failing seed is minimised to a case file that"
        " `herdsman sim replay` runs again. Exit status 1 when an invariant broke.",
    )
    numbers = (
        ("--seeds", 1, None, "N", "how many seeds to run, one after another"),
        ("--seed", 0, 0, "S", "the first seed (default 0): seeds S, S+1, ... S+N-1"),
        (
            "--budget",
            0,
            DEFAULT_BUDGET,
            "RUNS",
            f"scenario runs the minimiser may spend (default {DEFAULT_BUDGET};"
            " 0: do not minimise, write the whole failing scenario)",
        ),
    )
    for flag, least, default, metavar, text in numbers:
        fuzz.add_argument(
            flag,
            type=_whole(least),
            required=default is None,
            default=default,
            metavar=metavar,
            help=text,
        )
    fuzz.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="where a failing seed's minimised case goes (default herdsman-fuzz-SEED.jsonl)",
    )
    fuzz.set_defaults(handler=guarded(_fuzz))
