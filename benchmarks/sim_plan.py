"""Planning speed: the fast engine against a bare heap loop and SimPy, on one M/M/c model.

The model: Poisson arrivals, exponential durations, every run on a lane of
its own (no conversation), one provider with SLOTS slots, at 80% utilisation.
All three simulate the very same arrivals and durations, and report the mean
queue wait, which must agree (they are the same FIFO queue):

* the fast engine (``herdsman.sim.engine.FastEngine``, no trace written, as
  capacity planning runs it) — the scheduler and account cores at work;
* a bare heap loop: a FIFO of waiting runs and a heap of ends, nothing else
  — the ceiling for pure Python;
* SimPy (``pip install -e '.[bench]'``): a ``Resource`` with SLOTS places
  and one process per run.

Each is timed over the whole simulation (the workload is built before), the
best of --repeat runs. Prints simulated runs per wall second and the ratios.

    .venv/bin/python benchmarks/sim_plan.py [--runs 100000] [--slots 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import heapq
import logging
import random
import sys
import time
from collections import deque
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json
from herdsman.sim.engine import FastEngine
from herdsman.sim.workload import Arrival, Attempt, RunPlan, Workload, config_from_trace
from herdsman.trace import TraceHeader

UTILISATION = 0.8
MEAN_DURATION = 10.0


def mmc(runs: int, slots: int, seed: int = 1) -> list[tuple[float, float]]:
    """(arrival time, duration) pairs of an M/M/c queue at UTILISATION."""
    rng = random.Random(seed)
    rate = UTILISATION * slots / MEAN_DURATION
    t, out = 0.0, []
    for _ in range(runs):
        t += rng.expovariate(rate)
        out.append((t, rng.expovariate(1 / MEAN_DURATION)))
    return out


def as_workload(items: list[tuple[float, float]], slots: int) -> tuple[Workload, Any]:
    """The pairs as the fast engine's input: synthetic submits, one provider, no accounts."""
    text = f'[supervisor]\nstate_dir = "/sim"\n[providers.p]\nexec = ["p"]\nconcurrency = {slots}\n'
    loaded = load_config_text(text, Path("/sim/supervisor.toml"), environ={})
    config = config_as_json(loaded.config)
    arrivals = []
    plans = {}
    for index, (at, duration) in enumerate(items):
        run_id = f"r{index}"
        arrivals.append(Arrival(at, "submit", {"run": {"id": run_id, "provider": "p"}}))
        plans[run_id] = RunPlan(index, [Attempt(duration, "succeeded", 0)], synthetic=True)
    header = TraceHeader(1, "2026-11-30T00:00:00.000000Z", config, None)
    return Workload(header, 1_795_000_000.0, tuple(arrivals), plans), config_from_trace(
        config, "bench"
    )


def fast_engine(workload: Workload, loaded: Any) -> float:
    engine = FastEngine(workload, loaded, trace=False, waits=True)
    engine.run()
    assert engine.waits is not None
    return sum(engine.waits) / len(engine.waits)


def bare_loop(items: list[tuple[float, float]], slots: int) -> float:
    ends: list[float] = []
    waiting: deque[tuple[float, float]] = deque()
    total_wait = 0.0
    free = slots
    position, count = 0, len(items)
    while position < count or ends:
        if ends and (position == count or ends[0] <= items[position][0]):
            now = heapq.heappop(ends)
            free += 1
        else:
            now = items[position][0]
            waiting.append(items[position])
            position += 1
        while free and waiting:
            at, duration = waiting.popleft()
            total_wait += now - at
            free -= 1
            heapq.heappush(ends, now + duration)
    return total_wait / count


def simpy_model(items: list[tuple[float, float]], slots: int) -> float:
    import simpy  # noqa: PLC0415 - an optional extra

    env = simpy.Environment()
    server = simpy.Resource(env, capacity=slots)
    waits: list[float] = []

    def run(at: float, duration: float) -> Generator[Any, Any, None]:
        with server.request() as granted:
            yield granted
            waits.append(env.now - at)
            yield env.timeout(duration)

    def source() -> Generator[Any, Any, None]:
        for at, duration in items:
            yield env.timeout(at - env.now)
            env.process(run(at, duration))

    env.process(source())
    env.run()
    return sum(waits) / len(waits)


def best(repeat: int, fn: Callable[[], float]) -> tuple[float, float]:
    """(best wall seconds, the mean wait it reported)."""
    times, result = [], 0.0
    for _ in range(repeat):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return min(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    items = mmc(args.runs, args.slots)
    workload, loaded = as_workload(items, args.slots)
    print(
        f"M/M/{args.slots} at {UTILISATION:.0%} utilisation, {args.runs:,} runs,"
        f" best of {args.repeat}"
    )
    rows = {
        "fast engine": best(args.repeat, lambda: fast_engine(workload, loaded)),
        "bare heap loop": best(args.repeat, lambda: bare_loop(items, args.slots)),
    }
    try:
        rows["SimPy"] = best(args.repeat, lambda: simpy_model(items, args.slots))
    except ImportError:
        print("  (SimPy is not installed: pip install -e '.[bench]')")
    for name, (seconds, wait) in rows.items():
        rate = args.runs / seconds
        print(f"  {name:<16} {rate:>10,.0f} runs/s   ({seconds:.3f} s, mean wait {wait:.4f} s)")
    fast = args.runs / rows["fast engine"][0]
    print(f"  fast engine / bare heap loop: {fast / (args.runs / rows['bare heap loop'][0]):.2f}x")
    if "SimPy" in rows:
        print(f"  fast engine / SimPy:          {fast / (args.runs / rows['SimPy'][0]):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
