"""``herdsman sim generate``: its flags, read into a model, and the file written."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from herdsman.config import LoadedConfig, load_config
from herdsman.config.report import config_as_json
from herdsman.sim.generate import generate, load_samples
from herdsman.sim.model import (
    MAX_TURNS,
    OUTCOME_SHARES,
    Model,
    ModelError,
    parse_arrivals,
    parse_durations,
    parse_number,
    parse_profile,
    parse_seconds,
    parse_shares,
    parse_week,
    parse_weights,
)
from herdsman.sim.spend import FAILURE_CLASSES
from herdsman.sim.spend_model import parse_prices, parse_tokens
from herdsman.sim.what_if import header_config
from herdsman.trace import TraceFormatError, format_time, read_trace

__all__ = ["add_generate_command", "model_from_args"]


def _configuration(args: argparse.Namespace, model_traces: list[str]) -> LoadedConfig:
    """``-c FILE``, else the header of the first recorded trace the model names."""
    if args.config is not None:
        return load_config(args.config, args.overrides)
    if not model_traces:
        raise ModelError(
            "the workload needs a configuration: give -c supervisor.toml (or use a recorded"
            " trace with --arrivals recorded:TRACE or --durations empirical:TRACE, whose"
            " configuration is then taken)"
        )
    header, _ = read_trace(Path(model_traces[0]))
    return header_config(header.config, f"{model_traces[0]}:1", args.overrides)


def _start(text: str) -> str:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ModelError(
            f"--start: expected an ISO-8601 time with a zone (e.g. 2026-11-30T08:00:00Z),"
            f" got {text!r}"
        )
    return format_time(when)


def model_from_args(args: argparse.Namespace) -> tuple[Model, dict[str, Any]]:
    """The model the flags describe, and the configuration (as JSON) it runs under."""
    arrivals = parse_arrivals(args.arrivals)
    durations = parse_durations(args.durations)
    span = parse_seconds("--span", args.span)
    profile = None
    if args.profile is not None:
        if arrivals.kind != "poisson":
            raise ModelError("--profile: shapes poisson arrivals; recorded arrivals keep their own")
        profile = parse_profile(args.profile)
    week = None
    if args.week is not None:
        if arrivals.kind != "poisson":
            raise ModelError("--week: shapes poisson arrivals; recorded arrivals keep their own")
        week = parse_week(args.week)
    turns = parse_number(
        "--turns", "mean turns per conversation", args.turns, low=1, high=MAX_TURNS
    )
    think = parse_seconds("--think", args.think, positive=False)
    traces = [t for t in (arrivals.trace, durations.trace) if t is not None]
    for flag, spec, trace in (
        ("--arrivals", args.arrivals, arrivals.trace),
        ("--durations", args.durations, durations.trace),
    ):
        if trace is not None:
            try:  # the header is read at once, the events later: this names the flag
                read_trace(Path(trace))
            except TraceFormatError as error:
                raise ModelError(f"{flag} {spec}: {error}") from None
    loaded = _configuration(args, traces)
    known = list(loaded.config.providers)
    if not known:
        raise ModelError("the configuration has no providers: a run needs one")
    providers = (
        parse_weights("--providers", args.providers, known)
        if args.providers is not None
        else tuple((name, 1.0) for name in known)
    )
    outcomes = parse_shares("--outcomes", args.outcomes, OUTCOME_SHARES) if args.outcomes else ()
    limited = (
        parse_shares("--usage-limited", args.usage_limited, known) if args.usage_limited else ()
    )
    failures = parse_shares("--failures", args.failures, FAILURE_CLASSES) if args.failures else ()
    if sum(share for _, share in (*outcomes, *failures)) > 1:
        raise ModelError("--outcomes and --failures: their shares add up to more than 1")
    tokens = parse_tokens(args.tokens, known)
    prices = parse_prices(args.token_prices, tokens, known)
    model = Model(
        span=span,
        arrivals=arrivals,
        durations=durations,
        providers=providers,
        profile=profile,
        week=week,
        turns=turns,
        think=think,
        outcomes=outcomes,
        usage_limited=limited,
        started_at=_start(args.start),
        tokens=tokens,
        prices=prices,
        failures=failures,
    )
    return model, config_as_json(loaded.config)


def _generate(args: argparse.Namespace) -> int:
    model, config = model_from_args(args)
    text = generate(model, config, args.seed, load_samples(model))
    runs = text.count("\n") - 1
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    print(f"generated {runs} runs over {model.span:g} s (seed {args.seed})", file=sys.stderr)
    return 0


def add_generate_command(actions: Any, guarded: Any) -> None:
    """Add ``generate`` to the ``sim`` subcommands."""
    parser = actions.add_parser(
        "generate",
        help="write a synthetic workload trace from a small model (see docs/simulator.md)",
        description="Write a synthetic workload trace drawn from a small model: arrivals,"
        " run durations, turns per conversation, providers and outcomes, and what runs spend"
        " and the failures that end them. The same flags and seed always give the same trace.",
    )
    parser.add_argument(
        "--span", required=True, help="how long conversations keep arriving, e.g. 8h or 86400"
    )
    parser.add_argument(
        "--arrivals",
        required=True,
        metavar="poisson:RATE|recorded:TRACE",
        help="conversations per hour (Poisson), or gaps resampled from a recorded trace",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="W0,...,W23",
        help="24 hourly weights (UTC hours of the trace clock) shaping Poisson arrivals",
    )
    parser.add_argument(
        "--week",
        default=None,
        metavar="W_MON,...,W_SUN",
        help="7 daily weights, Monday first (UTC days of the trace clock) shaping Poisson"
        " arrivals, e.g. 1,1,1,1,1,0,0 for working days only",
    )
    parser.add_argument(
        "--durations",
        required=True,
        metavar="exponential:MEAN|lognormal:MEAN,SIGMA|empirical:TRACE",
        help="how long each run takes; MEAN in seconds or like 5m",
    )
    parser.add_argument(
        "--turns", default="1", help="mean turns per conversation (geometric, 1 to 1000; default 1)"
    )
    parser.add_argument(
        "--think",
        default="300",
        help="mean think time before a follow-up turn (exponential; default 300 s)",
    )
    parser.add_argument(
        "--providers",
        default=None,
        metavar="NAME=WEIGHT,...",
        help="which providers conversations use (default: every configured one, equally)",
    )
    parser.add_argument(
        "--outcomes",
        default=None,
        metavar="failed=SHARE,timed_out=SHARE",
        help="shares of runs that fail or time out (the rest succeed)",
    )
    parser.add_argument(
        "--usage-limited",
        default=None,
        metavar="PROVIDER=SHARE,...",
        help="share of a provider's runs that hit its account quota (the account rests)",
    )
    parser.add_argument(
        "--failures",
        default=None,
        metavar="CLASS=SHARE,...",
        help="shares of runs that end with a failure class: " + ", ".join(FAILURE_CLASSES),
    )
    parser.add_argument(
        "--tokens",
        action="append",
        default=[],
        metavar="PROVIDER=KIND:MEAN,...[,sigma:S]",
        help="mean tokens per run of each kind (input, cache_read, cache_write, output),"
        " e.g. claude=input:20k,output:8k; a run spends in proportion to its duration"
        " (repeatable, one per provider)",
    )
    parser.add_argument(
        "--token-prices",
        action="append",
        default=[],
        metavar="PROVIDER=KIND:USD,...",
        help="US dollars per million tokens of each kind, e.g. claude=input:3,output:15"
        " (repeatable, one per provider with --tokens)",
    )
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="the configuration the workload runs under (default: a recorded trace's)",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a setting of that configuration (repeatable)",
    )
    parser.add_argument(
        "--start",
        default="2026-11-30T00:00:00Z",
        help="the trace's start time (ISO-8601 with a zone; default 2026-11-30T00:00:00Z)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--out", type=Path, default=None, help="write the trace here (default: stdout)"
    )
    parser.set_defaults(handler=guarded(_generate))
