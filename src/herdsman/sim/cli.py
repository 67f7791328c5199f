"""``herdsman sim replay`` and ``sim diff``; ``generate``, ``plan`` and ``fuzz`` are added here."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

import attrs

from herdsman.config import ConfigError, load_config
from herdsman.runtime.dashboard.trace_view import add_view_command
from herdsman.sim.bounds import WALL_LIMIT
from herdsman.sim.cost import CostError
from herdsman.sim.fuzz.cli import add_fuzz_command, replay_case, seconds_flag
from herdsman.sim.fuzz.scenario import ScenarioError
from herdsman.sim.generate_cli import add_generate_command
from herdsman.sim.model import ModelError
from herdsman.sim.plan_cli import add_plan_command
from herdsman.sim.plan_report import PlotError
from herdsman.sim.slo import SloError
from herdsman.sim.sweep import SweepError
from herdsman.sim.what_if import SetError, header_config
from herdsman.trace import TraceFormatError

__all__ = ["add_sim_commands"]


def _replay(args: argparse.Namespace) -> int:
    from herdsman.sim.chrome import chrome_trace  # noqa: PLC0415 - pyfakefs is heavy
    from herdsman.sim.decisions import timeline_of  # noqa: PLC0415
    from herdsman.sim.result import recording_ends, summary  # noqa: PLC0415
    from herdsman.sim.workload import read_workload  # noqa: PLC0415
    from herdsman.trace import read_trace_text  # noqa: PLC0415

    if args.engine == "fast" and args.seed is not None:
        # Said, not ignored: a seed the user gave must not quietly do nothing.
        print(
            "herdsman: --seed reshuffles trio's wake-up order, which only --engine trio has;"
            " leave --seed out with --engine fast",
            file=sys.stderr,
        )
        return 2
    if args.engine == "fast" and args.wall_limit is not None:
        print(
            "herdsman: --wall-limit bounds the replay of --engine trio; the fast engine"
            " needs no bound: leave --wall-limit out with --engine fast",
            file=sys.stderr,
        )
        return 2
    # Said before the replay, not after it: the trace is not written to stdout
    # only for the timeline's file to fail.
    for flag, path in (("--out", args.out), ("--chrome-trace", args.chrome_trace)):
        if path is not None and not path.parent.is_dir():
            print(f"herdsman: {flag} {path}: no such directory {path.parent}", file=sys.stderr)
            return 2
    if len(args.traces) > 1 or args.out_dir is not None:
        return _replay_fleet(args)
    args.trace = args.traces[0]
    # What the simulated supervisor logs (usage limits, checkouts) is part of
    # the simulation, not news for whoever runs it: only errors are shown.
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    workload = read_workload(args.trace)
    if workload.header.fuzz is not None:
        return replay_case(args, workload.header)
    what_if = args.config is not None or bool(args.overrides)
    if args.config is not None:
        loaded = load_config(args.config, args.overrides)
    else:
        name = f"{args.trace}:1"
        loaded = header_config(workload.header.config, name, args.overrides)
    if what_if:
        # A what-if keeps its configuration: the recorded reloads would
        # quietly put the recorded one back.
        skipped = sum(1 for a in workload.arrivals if a.kind == "reload")
        workload = attrs.evolve(
            workload, arrivals=tuple(a for a in workload.arrivals if a.kind != "reload")
        )
        if skipped:
            print(
                f"a what-if configuration is given: the trace's {skipped} reload(s) are not"
                " replayed",
                file=sys.stderr,
            )
    if args.engine == "fast":
        from herdsman.sim.engine import fast_replay  # noqa: PLC0415

        result = recording_ends(fast_replay(workload, loaded), workload)
    else:
        from herdsman.sim.bounds import Stuck  # noqa: PLC0415
        from herdsman.sim.replay import replay  # noqa: PLC0415

        try:
            result = replay(
                workload,
                loaded,
                seed=args.seed,
                wall_limit=WALL_LIMIT if args.wall_limit is None else args.wall_limit,
            )
        except Stuck as stuck:
            return _stuck(args, stuck)
    if args.out is None:
        sys.stdout.write(result.trace)
    else:
        args.out.write_text(result.trace, encoding="utf-8")
    if args.chrome_trace is not None:
        _, events = read_trace_text(result.trace, "(simulated trace)")
        document = chrome_trace(timeline_of(events))
        args.chrome_trace.write_text(json.dumps(document), encoding="utf-8")
    print(summary(result), file=sys.stderr)
    return 0


def _replay_fleet(args: argparse.Namespace) -> int:
    """``sim replay M1 M2 ... --out-dir DIR``: a fleet's members' traces together."""
    from herdsman.sim.bounds import Stuck  # noqa: PLC0415
    from herdsman.sim.fleet_replay import fleet_replay, fleet_summary, read_member  # noqa: PLC0415

    refused = None
    if args.engine == "fast":
        refused = (
            "--engine fast replays one supervisor's trace; a fleet's traces replay with the"
            " trio engine (leave --engine out)"
        )
    elif args.out is not None or args.chrome_trace is not None:
        refused = (
            "--out and --chrome-trace take one trace; a fleet's replay writes one trace a"
            " member: give --out-dir DIR (and draw a member's output on its own)"
        )
    elif len(args.traces) < 2:  # a fleet
        refused = "--out-dir DIR: give the traces of the fleet's members (two or more)"
    elif args.out_dir is None:
        refused = "several traces replay together as one fleet's members: give --out-dir DIR"
    elif not args.out_dir.is_dir():
        refused = f"--out-dir {args.out_dir}: no such directory"
    if refused is not None:
        print(f"herdsman: {refused}", file=sys.stderr)
        return 2
    names = [path.name for path in args.traces]
    if len(set(names)) < len(names):
        print(
            "herdsman: two traces given have the same file name; each member's replay is"
            " written to --out-dir under its trace's name",
            file=sys.stderr,
        )
        return 2
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    members = [read_member(path) for path in args.traces]
    if args.config is not None:
        configs = [load_config(args.config, args.overrides) for _ in members]
    else:
        configs = [
            header_config(m.workload.header.config, f"{m.name}:1", args.overrides) for m in members
        ]
    try:
        result = fleet_replay(
            members,
            configs,
            what_if=args.config is not None or bool(args.overrides),
            seed=args.seed,
            wall_limit=WALL_LIMIT if args.wall_limit is None else args.wall_limit,
        )
    except Stuck as stuck:
        return _stuck(args, stuck)
    for name, text in zip(names, result.traces, strict=True):
        (args.out_dir / name).write_text(text, encoding="utf-8")
    print(fleet_summary(result), file=sys.stderr)
    return 0


def _stuck(args: argparse.Namespace, stuck: Exception) -> int:
    """Say that the replay stopped making progress, and how to run it again; exit 1."""
    print(
        f"herdsman: the replay stopped making progress: {stuck}; reproduce:"
        f" {_replay_command(args)}",
        file=sys.stderr,
    )
    return 1


def _replay_command(args: argparse.Namespace) -> str:
    """The command line that runs this replay again (without its outputs)."""
    words = ["herdsman", "sim", "replay", *(str(path) for path in args.traces)]
    if args.config is not None:
        words += ["-c", str(args.config)]
    for override in args.overrides:
        words += ["--set", override]
    if args.seed is not None:
        words += ["--seed", str(args.seed)]
    if args.wall_limit is not None:
        words += ["--wall-limit", f"{args.wall_limit:g}"]
    return shlex.join(words)


def _diff(args: argparse.Namespace) -> int:
    from herdsman.sim.decisions import read_decisions  # noqa: PLC0415
    from herdsman.sim.diff import first_divergence, report, workload_note  # noqa: PLC0415

    a, b = read_decisions(args.a), read_decisions(args.b)
    divergence = first_divergence(a, b)
    if args.json:
        from herdsman.sim.diff import diff_json  # noqa: PLC0415

        print(json.dumps(diff_json(divergence, a, b, (str(args.a), str(args.b))), indent=2))
        return 0 if divergence is None else 1
    # dict.fromkeys: one note for a workload given as both A and B, in order.
    notes = list(
        dict.fromkeys(
            workload_note(path, timeline) for path, timeline in ((args.a, a), (args.b, b))
        )
    )
    if divergence is None:
        compared = min(len(a.decisions), len(b.decisions))
        line = f"the traces agree on all {compared} decisions"
        for name, timeline, other in ((args.a, a, b), (args.b, b, a)):
            if timeline.rotated and len(other.decisions) > len(timeline.decisions):
                line += (
                    f"; {name} was rotated (the recording goes on in another file),"
                    " so the other trace's later decisions are not compared"
                )
        print("\n".join([line, *(note for note in notes if note)]))
        return 0
    print("\n".join([report(divergence, a, b, (str(args.a), str(args.b))), *filter(None, notes)]))
    return 1


def _guarded(handler: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = handler(args)
        except (
            TraceFormatError,
            ModelError,
            SweepError,
            SloError,
            CostError,
            PlotError,
            ScenarioError,
            SetError,
        ) as error:
            print(f"herdsman: {error}", file=sys.stderr)
            return 2
        except ConfigError as error:
            for problem in error.problems:
                print(problem, file=sys.stderr)
            return 2
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the command line's own quiet exit
        except OSError as error:
            print(f"herdsman: {error.filename or ''}: {error.strerror or error}", file=sys.stderr)
            return 2
        return code

    return run


def add_sim_commands(commands: Any) -> None:
    """Add ``sim`` and its subcommands to the ``herdsman`` parser."""
    sim = commands.add_parser(
        "sim",
        help="replay traces on a simulated clock, compare them",
        description="The simulator: replay a trace on a simulated clock, compare two traces'"
        " decisions, generate a synthetic workload, plan capacity, fuzz the supervisor with"
        " faults (see docs/simulator.md).",
    )
    actions = sim.add_subparsers(dest="sim_command", metavar="ACTION", required=True)

    replay = actions.add_parser(
        "replay",
        help="replay a recorded trace deterministically (see docs/simulator.md)",
        description="Replay a recorded trace (or a fuzz case file) on a simulated clock and"
        " write the trace the simulated supervisor records; the same input always gives the"
        " same output. A summary goes to stderr.",
    )
    replay.add_argument(
        "-c",
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a what-if configuration (default: the one in the trace's header)",
    )
    replay.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a setting of the configuration replayed (repeatable), e.g."
        " providers.claude.concurrency=1",
    )
    replay.add_argument(
        "traces",
        type=Path,
        nargs="+",
        metavar="TRACE",
        help="a trace file (JSON Lines); several: the traces of one fleet's members, replayed"
        " together (with --out-dir)",
    )
    replay.add_argument(
        "--seed",
        type=int,
        default=None,
        help="reshuffle trio's task wake-up order with this seed (the output must not change)",
    )
    replay.add_argument(
        "--engine",
        choices=("trio", "fast"),
        default="trio",
        help="trio: the whole supervisor on a fake clock (default); fast: only the scheduling"
        " and account cores on a heap loop, the same decisions many times faster",
    )
    replay.add_argument(
        "--out", type=Path, default=None, help="write the simulated trace here (default: stdout)"
    )
    replay.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="with several traces (a fleet's members): write each member's simulated trace"
        " here, under its trace's file name",
    )
    replay.add_argument(
        "--wall-limit",
        type=seconds_flag,
        default=None,
        metavar="SECONDS",
        help="a replay with no end after SECONDS of wall time is stuck: exit 1 with the line"
        f" that reproduces it (default {WALL_LIMIT:g}; it stops sooner at a spin or a stall)",
    )
    replay.add_argument(
        "--chrome-trace",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the timeline for Perfetto / chrome://tracing",
    )
    replay.set_defaults(handler=_guarded(_replay))

    diff = actions.add_parser(
        "diff",
        help="the first decision two traces disagree on (exit 1), or none (exit 0)",
        description="Compare the decisions (starts, finishes, skips, usage limits, lost runs)"
        " of two traces, times aside, and show the first one they disagree on with the"
        " decisions before it. Exit status 0 when they agree, 1 when they do not.",
    )
    diff.add_argument("a", type=Path, metavar="A", help="the expected trace")
    diff.add_argument("b", type=Path, metavar="B", help="the actual trace")
    diff.add_argument("--json", action="store_true", help="machine-readable output")
    diff.set_defaults(handler=_guarded(_diff))

    add_generate_command(actions, _guarded)
    add_plan_command(actions, _guarded)
    add_fuzz_command(actions, _guarded)
    add_view_command(actions, _guarded)
