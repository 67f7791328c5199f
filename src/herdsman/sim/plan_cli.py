"""``herdsman sim plan``: its flags, the progress bar, and the exit status."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from herdsman.sim.model import ModelError
from herdsman.sim.plan import plan, read_input
from herdsman.sim.plan_report import check_plot, plan_json, plan_table, plot_waits
from herdsman.sim.slo import parse_slo
from herdsman.sim.sweep import parse_vary

__all__ = ["add_plan_command"]

#: More replications than this is a typo, not a plan.
MAX_REPLICATIONS = 10_000


def _whole(flag: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ModelError(f"{flag}: expected a whole number from {low} to {high}, got {text!r}")
    return value


def _plan(args: argparse.Namespace) -> int:
    # Every flag is checked before the first simulation: a sweep can be long.
    varies = [parse_vary(text) for text in args.vary]
    slo = parse_slo(args.slo)
    replications = _whole("--replications", args.replications, 1, MAX_REPLICATIONS)
    workers = _whole("--workers", args.workers, 1, 1024) if args.workers else os.cpu_count() or 1
    if args.plot is not None:
        check_plot(args.plot)
    source = read_input(args.trace)
    bar = _progress_bar()
    try:
        result = plan(
            source,
            varies,
            slo,
            replications=replications,
            seed=args.seed,
            workers=workers,
            progress=bar.update if bar is not None else None,
        )
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        sys.stdout.write(json.dumps(plan_json(result, source), indent=2) + "\n")
    else:
        sys.stdout.write(plan_table(result))
    if args.plot is not None:
        plot_waits(result, args.plot)
    return 0 if result.smallest is not None else 1


class _Bar:
    """A tqdm bar on standard error, made once the number of simulations is known."""

    def __init__(self) -> None:
        self._bar: Any = None

    def update(self, done: int, total: int) -> None:
        if self._bar is None:
            from tqdm import tqdm  # noqa: PLC0415 - only a plan needs it

            self._bar = tqdm(total=total, desc="simulating", unit="sim", file=sys.stderr)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _progress_bar() -> _Bar | None:
    return _Bar() if sys.stderr.isatty() else None


def add_plan_command(actions: Any, guarded: Any) -> None:
    """Add ``plan`` to the ``sim`` subcommands."""
    parser = actions.add_parser(
        "plan",
        help="sweep config keys over a workload; the smallest configuration meeting an SLO"
        " (see docs/capacity-planning.md)",
        description="Replay a workload under every combination of the --vary values and find"
        " the smallest configuration that meets the --slo. Exit status 1 when none does.",
    )
    parser.add_argument(
        "trace", type=Path, metavar="TRACE", help="a recorded trace or a generated workload"
    )
    parser.add_argument(
        "--vary",
        action="append",
        required=True,
        metavar="KEY=RANGE",
        help="a config key and its values: 1..8 or 1,2,4 (repeatable; combinations multiply);"
        " providers.NAME.accounts=N varies the number of accounts",
    )
    parser.add_argument(
        "--slo",
        required=True,
        metavar="EXPR",
        help="what a configuration must meet, e.g. 'p95_wait<=60s' or"
        " 'p95_wait<=5m,utilisation>=50%%'",
    )
    parser.add_argument(
        "--replications",
        default="5",
        metavar="N",
        help="replications per configuration (default 5; see docs/capacity-planning.md)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the replications (default 0)")
    parser.add_argument(
        "--workers",
        default=None,
        metavar="N",
        help="worker processes (default: one per CPU); the result does not depend on it",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="draw wait percentiles against the varied key (needs herdsman[plot])",
    )
    parser.set_defaults(handler=guarded(_plan))
