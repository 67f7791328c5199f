"""A capacity plan as a user runs it: a month of a 50-engineer team, 16 configurations x 10.

The workload is drawn by ``herdsman sim generate`` (the real CLI): about 20
runs per engineer per working day — 1,000 a working day for 50 engineers —
as conversations of 3 turns on average with 5-minute think times,
lognormal durations (mean 6 minutes, sigma 1), 09:00-17:00 on weekdays,
over the 30 days from Monday 2026-11-30 (22 working days, about 22,000
runs), 4 in 5 conversations on Claude, the rest on Codex.

The plan is ``herdsman sim plan`` (the real CLI) varying Claude's slots
(8, 12, 16, 20) and accounts (1 to 4: each allows 5 runs at once and 200
runs per 5 hours) — 16 configurations — on 10 replications each, with
``--workers 2``; it prints the wall time of each run, the CPU time its
processes used, and the machine's load around it. Rounds alternate
``--workers 2`` and ``--workers 1`` and the outputs must be byte for byte
the same (the result does not depend on the number of workers).

``--breakdown`` says where a plan's time goes, in CPU seconds of this one
process (so the machine's other load barely moves it): reading the
workload, building one replication (drawing it, as a worker does), and one
simulation of each configuration on it; then what a plan of that size
costs in all, and its floor on two cores.

``--cachegrind`` counts the instructions of a simulated run instead, which
the machine's other load does not move: two of the month's configurations
(Claude at 8 slots with one account, at 20 with two) simulated on one
replication, under valgrind's cachegrind, less a pass that only reads the
month and builds the replication.

    .venv/bin/python benchmarks/plan_month.py [--rounds 2] [--workers-only] [--breakdown]
    .venv/bin/python benchmarks/plan_month.py --cachegrind
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """\
[supervisor]
state_dir = "/team/state"
max_concurrency = 64

[providers.claude]
exec = ["claude", "-p"]
protocol = "claude"
concurrency = 12

[[providers.claude.accounts]]
name = "team"
window = "5h"
budget = 200
budget_unit = "runs"
concurrency = 5

[providers.codex]
exec = ["codex", "exec", "-"]
protocol = "codex"
concurrency = 4
"""

#: 1,000 runs a working day in 3-turn conversations, over a 168-hour week
#: of which 40 hours are worked: conversations per hour, averaged over the week.
RATE = 1000 * 5 / 3 / 168
GENERATE = [
    "--span", "30d",
    "--arrivals", f"poisson:{RATE:.4f}",
    "--profile", ",".join(["0"] * 9 + ["1"] * 8 + ["0"] * 7),
    "--week", "1,1,1,1,1,0,0",
    "--durations", "lognormal:6m,1.0",
    "--turns", "3",
    "--think", "5m",
    "--providers", "claude=4,codex=1",
    "--start", "2026-11-30T00:00:00Z",
    "--seed", "1",
]  # fmt: skip
VARY = ["providers.claude.concurrency=8,12,16,20", "providers.claude.accounts=1..4"]
SLO = "p95_wait<=15m"
REPLICATIONS = "10"

#: The name a plan's workers load each configuration under (``_Worker._config``):
#: loaded so, a configuration is the one the engine finds already loaded when it
#: loads it again for each simulation, as in a plan, where only a worker's first
#: simulation of a configuration loads it (``config_from_trace``).
WORKERS_NAME = "configuration"


def herdsman(*args: str) -> tuple[float, float, str]:
    """Run the CLI; its wall seconds, its CPU seconds (itself and its workers), its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "herdsman", *args], capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        sys.exit(f"herdsman {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def load() -> str:
    """The 1-minute load average, and this machine's cores."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"


def generate(directory: Path) -> Path:
    config = directory / "team.toml"
    config.write_text(CONFIG, encoding="utf-8")
    month = directory / "month.jsonl"
    wall, _, _ = herdsman("sim", "generate", "-c", str(config), *GENERATE, "--out", str(month))
    runs = month.read_text(encoding="utf-8").count("\n") - 1
    print(f"generated a month: {runs:,} runs in {wall:.1f} s")
    return month


def plan_args(month: Path, workers: int) -> list[str]:
    args = ["sim", "plan", str(month), "--slo", SLO, "--replications", REPLICATIONS]
    for vary in VARY:
        args += ["--vary", vary]
    return [*args, "--workers", str(workers), "--json"]


def rounds(month: Path, count: int, workers_only: bool) -> int:
    outputs: dict[int, str] = {}
    walls: dict[int, list[float]] = {1: [], 2: []}
    for number in range(1, count + 1):
        for workers in (2,) if workers_only else (2, 1):
            before = load()
            wall, cpu, out = herdsman(*plan_args(month, workers))
            print(
                f"round {number}: --workers {workers}: {wall:6.1f} s wall, {cpu:6.1f} s CPU"
                f" ({before} before, {load()} after)"
            )
            walls[workers].append(wall)
            if outputs.setdefault(workers, out) != out:
                print(f"  different output from the first --workers {workers} run")
                return 1
    if not workers_only:
        same = outputs[1] == outputs[2]
        print(f"--workers 1 and --workers 2 give the same output: {'yes' if same else 'NO'}")
        if not same:
            return 1
    print(
        f"16 configurations x {REPLICATIONS} replications, --workers 2:"
        f" best {min(walls[2]):.1f} s, worst {max(walls[2]):.1f} s (target: 30 s)"
    )
    return 0


def breakdown(month: Path) -> None:
    from herdsman.config.report import config_as_json  # noqa: PLC0415
    from herdsman.sim.collector import young_collections_rarer  # noqa: PLC0415
    from herdsman.sim.plan import DEFAULT_ENGINE, read_input, replication  # noqa: PLC0415
    from herdsman.sim.sweep import configure, parse_vary, settings  # noqa: PLC0415
    from herdsman.sim.workload import config_from_trace  # noqa: PLC0415

    logging.getLogger("herdsman").setLevel(logging.ERROR)
    clock = time.process_time
    began = clock()
    source = read_input(month)
    read = clock() - began
    began = clock()
    with young_collections_rarer():  # as a worker builds and simulates
        workload = replication(source, 1, 0)
    build = clock() - began
    varies = [parse_vary(v) for v in VARY]
    header = source.workload.header.config
    configs = [
        config_from_trace(config_as_json(configure(header, varies, s).config), WORKERS_NAME)
        for s in settings(varies)
    ]
    costs = []
    for loaded in configs:
        began = clock()
        with young_collections_rarer():
            DEFAULT_ENGINE(workload, loaded)
        costs.append(clock() - began)
    runs = len(workload.plans)
    simulate = sum(costs)
    replications = int(REPLICATIONS)
    total = replications * build + replications * simulate
    print(f"CPU seconds of one process ({load()}):")
    print(f"  read the month ({len(source.workload.plans):,} runs):     {read:6.2f}")
    print(f"  build one replication ({runs:,} runs):    {build:6.2f}")
    print(
        f"  simulate it under each configuration: {min(costs):.2f} to {max(costs):.2f}"
        f" ({runs / (simulate / len(costs)):,.0f} runs/s on average)"
    )
    print(
        f"  a plan of {len(configs)} x {replications}: {total:.1f} CPU s"
        f" ({replications * build:.1f} building, {replications * simulate:.1f} simulating);"
        f" at least {total / 2:.1f} s on 2 idle cores"
    )


#: The configurations --cachegrind simulates: (Claude's slots, its accounts).
MEASURED = (("8", "1"), ("20", "2"))


def cachegrind_child(month: Path, simulate: bool) -> None:
    """One --cachegrind pass: read the month, build replication 1, and maybe simulate it."""
    from herdsman.config.report import config_as_json  # noqa: PLC0415
    from herdsman.sim.collector import young_collections_rarer  # noqa: PLC0415
    from herdsman.sim.plan import DEFAULT_ENGINE, read_input, replication  # noqa: PLC0415
    from herdsman.sim.sweep import configure, parse_vary, settings  # noqa: PLC0415
    from herdsman.sim.workload import config_from_trace  # noqa: PLC0415

    logging.getLogger("herdsman").setLevel(logging.ERROR)
    source = read_input(month)
    varies = [parse_vary(v) for v in VARY]
    header = source.workload.header.config
    chosen = [s for s in settings(varies) if tuple(str(value) for _, value in s) in MEASURED]
    configs = [
        config_from_trace(config_as_json(configure(header, varies, s).config), WORKERS_NAME)
        for s in chosen
    ]
    with young_collections_rarer():
        workload = replication(source, 1, 0)
        if simulate:
            for loaded in configs:
                DEFAULT_ENGINE(workload, loaded)
    print(len(workload.plans))


def cachegrind(month: Path) -> None:
    counts: dict[bool, int] = {}
    runs = 0
    for simulate in (False, True):
        out = month.parent / f"cachegrind.{simulate}.out"
        done = subprocess.run(
            [
                "valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}",
                sys.executable, __file__, "--child", str(month), *(["--simulate"] * simulate),
            ],
            capture_output=True, text=True, check=False, env={**os.environ, "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
        if done.returncode != 0 or found is None:
            sys.exit(f"cachegrind failed:\n{done.stderr[-2000:]}")
        counts[simulate] = int(found.group(1).replace(",", ""))
        runs = int(done.stdout.split()[-1])
    per_run = (counts[True] - counts[False]) / (len(MEASURED) * runs)
    print(
        f"{len(MEASURED)} configurations (Claude's slots, accounts: {MEASURED}) x {runs:,} runs,"
        f" PYTHONHASHSEED=0: {per_run:,.0f} instructions per simulated run"
        " (reading the month and building the replication taken off)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds to time (default 2)")
    parser.add_argument(
        "--workers-only", action="store_true", help="time --workers 2 only (no --workers 1)"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="where the time goes, in CPU seconds"
    )
    parser.add_argument("--cachegrind", action="store_true", help="instructions per simulated run")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--simulate", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        cachegrind_child(args.child, args.simulate)
        return 0
    with tempfile.TemporaryDirectory(prefix="plan-month-") as directory:
        month = generate(Path(directory))
        if args.breakdown:
            breakdown(month)
            return 0
        if args.cachegrind:
            cachegrind(month)
            return 0
        return rounds(month, args.rounds, args.workers_only)


if __name__ == "__main__":
    sys.exit(main())
