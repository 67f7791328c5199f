"""Replay speed: ``herdsman sim replay`` against a bare trio + MockClock loop.

The bare loop is the ceiling: one task feeding arrivals, one task per running
run that sleeps its duration behind a CapacityLimiter, on the same clock. The
replay does what the supervisor does for each run (ledger, scheduler, trace,
fake runner) on top. Both handle the same synthetic workload: RUNS runs,
Poisson arrivals, exponential durations, SLOTS slots.

    .venv/bin/python benchmarks/sim_replay.py [--runs 100000] [--slots 8]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

import trio
import trio.testing

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload


def workload(runs: int, slots: int, seed: int = 1) -> list[tuple[float, float]]:
    """(arrival time, duration) pairs at 80% utilisation."""
    rng = random.Random(seed)
    mean_duration = 10.0
    rate = 0.8 * slots / mean_duration
    t, out = 0.0, []
    for _ in range(runs):
        t += rng.expovariate(rate)
        out.append((round(t, 6), round(rng.expovariate(1 / mean_duration), 6)))
    return out


def bare_loop(items: list[tuple[float, float]], slots: int) -> float:
    async def main() -> None:
        limiter = trio.CapacityLimiter(slots)

        async def one(duration: float) -> None:
            async with limiter:
                await trio.sleep(duration)

        async with trio.open_nursery() as nursery:
            for arrival, duration in items:
                await trio.sleep_until(arrival)
                nursery.start_soon(one, duration)

    began = time.perf_counter()
    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return time.perf_counter() - began


def write_trace(path: Path, items: list[tuple[float, float]], slots: int) -> None:
    config = load_config_text(
        f'[supervisor]\nstate_dir = "/bench/state"\n[providers.p]\nexec = ["x"]\n'
        f"concurrency = {slots}\n",
        Path("/bench/supervisor.toml"),
        environ={},
    ).config
    header = {
        "herdsman_trace": 1,
        "started_at": "2026-11-29T00:00:00.000000Z",
        "config": config_as_json(config),
    }
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps(header) + "\n")
        for n, (arrival, duration) in enumerate(items):
            event = {
                "t": arrival,
                "seq": n,
                "event": "submit",
                "run": {"id": f"r{n}", "provider": "p", "workspace": "default"},
                "duration": duration,
                "outcome": "succeeded",
            }
            out.write(json.dumps(event) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--slots", type=int, default=8)
    args = parser.parse_args()
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    items = workload(args.runs, args.slots)
    print(f"{args.runs:,} runs, {args.slots} slots, 80% utilisation")
    bare = bare_loop(items, args.slots)
    print(f"bare trio + MockClock loop:   {args.runs / bare:>9,.0f} runs per wall second")
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.jsonl"
        write_trace(trace, items, args.slots)
        loaded_workload = read_workload(trace)
        loaded = config_from_trace(loaded_workload.header.config, "header")
        result = replay(loaded_workload, loaded)
    rate = result.runs / result.wall_seconds
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"herdsman sim replay:          {rate:>9,.0f} runs per wall second"
        f" ({100 * rate / (args.runs / bare):.0f}% of the bare loop; peak RSS {peak:,.0f} MiB)"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
