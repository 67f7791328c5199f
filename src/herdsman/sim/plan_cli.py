"""``herdsman sim plan``: its flags, the progress bar, and the exit status."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from herdsman.sim.cost import parse_costs
from herdsman.sim.model import ModelError
from herdsman.sim.plan import AUTO_CAP, AUTO_FIRST, Replications, plan, read_input
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


def _replications(text: str) -> Replications:
    """``N``, ``auto`` or ``auto:CAP``."""
    if text == "auto":
        return Replications.automatic()
    if text.startswith("auto:"):
        cap = text.removeprefix("auto:")
        return Replications.automatic(
            _whole("--replications auto:CAP", cap, AUTO_FIRST, MAX_REPLICATIONS)
        )
    try:
        int(text)
    except ValueError:
        raise ModelError(
            f"--replications: expected a whole number from 1 to {MAX_REPLICATIONS}, auto or"
            f" auto:CAP, got {text!r}"
        ) from None
    return Replications.fixed(_whole("--replications", text, 1, MAX_REPLICATIONS))


def _plan(args: argparse.Namespace) -> int:
    # Every flag is checked before the first simulation: a sweep can be long.
    varies = [parse_vary(text) for text in args.vary]
    # Several --slo flags are one SLO: every clause of each must hold.
    slo = parse_slo(",".join(args.slo))
    replications = _replications(args.replications)
    prices = parse_costs(args.cost)
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
            prices=prices,
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
    return 0 if result.answer is not None else 1


class _Bar:
    """A tqdm bar on standard error, made once the number of simulations is known."""

    def __init__(self) -> None:
        self._bar: Any = None

    def update(self, done: int, total: int) -> None:
        if self._bar is None:
            from tqdm import tqdm  # noqa: PLC0415 - only a plan needs it

            self._bar = tqdm(total=total, desc="simulating", unit="sim", file=sys.stderr)
        if self._bar.total != total:  # --replications auto plans more at each look
            self._bar.total = total
            self._bar.refresh()
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
        help="sweep config keys over a workload; the smallest (or cheapest) configuration"
        " meeting an SLO (see docs/capacity-planning.md)",
        description="Replay a workload under every combination of the --vary values and find"
        " the smallest configuration that meets the --slo, or with --cost the cheapest."
        " Exit status 1 when none does.",
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
        action="append",
        required=True,
        metavar="EXPR",
        help="what a configuration must meet, e.g. 'p95_wait<=60s' or"
        " 'p95_wait<=5m,utilisation>=50%%' (repeatable: every clause must hold)",
    )
    parser.add_argument(
        "--replications",
        default="5",
        metavar="N|auto|auto:CAP",
        help="replications per configuration (default 5), or auto: more until each"
        " configuration's interval decides the SLO, at most CAP"
        f" (default {AUTO_CAP})"
        " (see docs/capacity-planning.md)",
    )
    parser.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="KEY=PRICE",
        help="price one unit of a config key per month, e.g. providers.claude.concurrency=40"
        " (a slot) or providers.claude.accounts=200 (an account); the answer is then the"
        " cheapest configuration meeting the SLO (repeatable)",
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
        help="draw the SLO's metric against the varied keys, each configuration marked"
        " meets/misses (needs herdsman[plot])",
    )
    parser.set_defaults(handler=guarded(_plan))
