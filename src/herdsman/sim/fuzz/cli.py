"""``herdsman sim fuzz``, and ``herdsman sim replay`` of a case file it wrote."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from herdsman.sim.bounds import WALL_LIMIT
from herdsman.sim.fuzz.scenario import scenario_from_json
from herdsman.trace import TraceHeader

__all__ = ["add_fuzz_command", "replay_case", "seconds_flag"]

#: What one minimisation may cost, in scenario runs.
DEFAULT_BUDGET = 200
#: The wall limit, from a module light enough to build the parser (pyfakefs is heavy).
WALL_LIMIT_DEFAULT = WALL_LIMIT
#: The violation kind of a scenario that gave no verdict in time (harness.WALL_LIMIT).
WALL_TIME = "wall time"


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


def seconds_flag(text: str) -> float:
    """A flag's seconds, > 0 and finite (argparse's ``type``)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _fuzz(args: argparse.Namespace) -> int:
    if args.fleet is not None:
        from herdsman.sim.fuzz.fleet_cli import fuzz_fleet  # noqa: PLC0415

        return fuzz_fleet(args, DEFAULT_BUDGET)
    from herdsman.sim.fuzz.campaign import (  # noqa: PLC0415 - pyfakefs is heavy
        fuzz_seeds,
        minimise,
        reproduce_command,
        write_case,
    )
    from herdsman.sim.fuzz.progress import Progress  # noqa: PLC0415

    # The simulated supervisor's own logs (faults are its daily bread) are
    # not news for whoever fuzzes it: the verdict is.
    logging.getLogger("herdsman").setLevel(logging.CRITICAL)
    first = args.seed
    tty = sys.stderr.isatty()
    columns = shutil.get_terminal_size().columns
    with Progress(sys.stderr, args.seeds, tty=tty, columns=columns) as progress:
        batch = fuzz_seeds(
            range(first, first + args.seeds),
            progress.finished,
            workers=args.workers,
            wall_limit=args.wall_limit,
            on_start=progress.started,
            on_end=progress.ended,
        )
    span = f"seed {first}" if args.seeds == 1 else f"seeds {first}..{first + args.seeds - 1}"
    report: dict[str, Any] = {
        "seeds": {"first": first, "asked": args.seeds, "run": batch.seeds},
        "workers": args.workers,
        "runs": batch.runs,
        "faults": batch.faults,
        "simulated_seconds": round(batch.simulated, 3),
        "wall_seconds": round(batch.elapsed, 3),
        "held": batch.failure is None,
        "findings": [],
    }
    failure = batch.failure
    say = _Say(json_out=args.json)
    if failure is None:
        say(
            f"fuzzed {span}: {batch.runs} runs, {batch.faults} faults,"
            f" {batch.simulated / 3600:.1f} simulated hours in {batch.elapsed:.1f} s wall"
            f" ({batch.seeds / max(batch.elapsed, 1e-9):.2f} seeds/s); every invariant held"
        )
        say.json(report)
        return 0
    seed = failure.scenario.seed
    first_violation = failure.violations[0]
    finding: dict[str, Any] = {
        "seed": seed,
        "violation": _violation_json(first_violation),
        "reproduce": reproduce_command(seed),
        "events": len(failure.scenario.events),
    }
    say(f"seed {seed} broke an invariant after {batch.seeds - 1} seed(s) that held:")
    say(f"  {first_violation}")
    say(f"reproduce: {reproduce_command(seed)}")
    out = args.out if args.out is not None else Path(f"herdsman-fuzz-{seed}.jsonl")
    if first_violation.kind == WALL_TIME:
        # Whether it happens again depends on the machine: ddmin, which
        # needs the same answer for the same events, cannot cut it down.
        say("not minimised: a verdict of wall time is the machine's as much as the seed's")
    elif args.budget:
        smaller, found = minimise(failure, budget=args.budget, wall_limit=args.wall_limit)
        if not smaller.failed:  # cannot happen: ddmin keeps a failing subset
            smaller = failure
        note = "" if found.complete else f" (stopped at --budget {args.budget})"
        say(
            f"minimised to {len(smaller.scenario.events)} of {len(failure.scenario.events)}"
            f" events in {found.tries} runs{note}:"
        )
        say(f"  {smaller.violations[0]}")
        finding["minimised"] = {
            "events": len(smaller.scenario.events),
            "tries": found.tries,
            "complete": found.complete,
            "violation": _violation_json(smaller.violations[0]),
        }
        failure = smaller
    write_case(out, failure)
    say(f"wrote {out}; replay it: herdsman sim replay {out}")
    finding["case"] = str(out)
    finding["replay"] = f"herdsman sim replay {out}"
    report["findings"].append(finding)
    say.json(report)
    return 1


class _Say:
    """Lines for a reader, or — with ``--json`` — one JSON document instead."""

    def __init__(self, *, json_out: bool) -> None:
        self._json = json_out

    def __call__(self, line: str) -> None:
        if not self._json:
            print(line, flush=True)

    def json(self, document: dict[str, Any]) -> None:
        if self._json:
            print(json.dumps(document, indent=2))


def _violation_json(violation: Any) -> dict[str, Any]:
    return {"kind": violation.kind, "t": violation.t, "message": violation.message}


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
    limit = args.wall_limit
    verdict = run_scenario(scenario, wall_limit=WALL_LIMIT if limit is None else limit)
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
        " invariants after every event. A failing seed (a hang included) is reported with"
        " the command that runs it again and minimised to a case file that"
        " `herdsman sim replay` runs again. Progress goes to standard error."
        " Exit status 1 when an invariant broke.",
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
        "--workers",
        type=_whole(1),
        default=1,
        metavar="N",
        help="run seeds side by side in N processes (default 1); the result is the same for any N",
    )
    fuzz.add_argument(
        "--wall-limit",
        type=seconds_flag,
        default=WALL_LIMIT_DEFAULT,
        metavar="SECONDS",
        help=f"a seed with no verdict after SECONDS of wall time is a finding"
        f" (default {WALL_LIMIT_DEFAULT:g})",
    )
    fuzz.add_argument(
        "--fleet",
        type=_whole(2),
        default=None,
        metavar="MEMBERS",
        help="fuzz a fleet of MEMBERS supervisors on one simulated ledger instead, one of"
        " them killed at a drawn moment (see docs/simulator.md)",
    )
    fuzz.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document with the result (seeds, findings, reproduction,"
        " case file) instead of lines",
    )
    fuzz.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="where a failing seed's minimised case goes (default herdsman-fuzz-SEED.jsonl)",
    )
    fuzz.set_defaults(handler=guarded(_fuzz))
