"""Planning speed: the fast engine against a bare heap loop and SimPy, on one M/M/c model.

The model: Poisson arrivals, exponential durations, every run on a lane of
its own (no conversation), one provider with SLOTS slots, at 80% utilisation.
All three simulate the very same arrivals and durations, and report the mean
queue wait, which must agree (they are the same FIFO queue):

* the fast engine exactly as ``herdsman sim plan`` runs it
  (``herdsman.sim.plan.fast_engine``: no trace written, the plan's metrics
  added up as events happen) — the scheduler and account cores at work;
* the cores only: the same scheduler and account calls in a bare loop —
  the least the engine can cost while it drives the cores;
* a bare heap loop: a FIFO of waiting runs and a heap of ends, nothing else
  — the ceiling for pure Python;
* SimPy (``pip install -e '.[bench]'``): a ``Resource`` with SLOTS places
  and one process per run.

Each is timed over the whole simulation (the workload is built before, as
``sim plan`` builds a replication once for all its configurations: each
arrival's run request and rounded time come with it), the best of --repeat
runs. Prints simulated runs per wall second and the ratios.

``--cachegrind`` counts instructions per simulated run instead, which the
machine's other load does not move: each contender runs in a process of its
own under valgrind's cachegrind, at RUNS and RUNS/3 runs, less a pass that
only builds the workload (``benchmarks/instructions.py``).

    .venv/bin/python benchmarks/sim_plan.py [--runs 100000] [--slots 8] [--repeat 3]
    .venv/bin/python benchmarks/sim_plan.py --cachegrind [--runs 30000] [--jobs 2]
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

from herdsman.config import LoadedConfig
from herdsman.core import Limits, RunRequest, Scheduler
from herdsman.core.accounts import AccountBook
from herdsman.sim.plan import fast_engine as plan_engine
from herdsman.sim.queueing import mmc_arrivals, mmc_workload
from herdsman.sim.workload import Workload
from instructions import instructions_per_run

UTILISATION = 0.8
MEAN_DURATION = 10.0


def fast_engine(workload: Workload, loaded: LoadedConfig) -> float:
    # What one task of `sim plan` costs: the simulation and all its metrics.
    return plan_engine(workload, loaded).mean_wait


def cores_only(items: list[tuple[float, float]], slots: int) -> float:
    """The scheduler and account cores in a bare loop: what the engine costs at the least.

    Every run is submitted, started through an account gate and finished,
    as the engine does, with nothing else around: no trace, no attempts,
    no bookkeeping of runs.
    """
    scheduler = Scheduler(Limits({"p": slots}))
    book = AccountBook({"p": []})
    requests = [RunRequest(f"r{index}", "p") for index in range(len(items))]
    ends: list[tuple[float, int]] = []
    total_wait = 0.0
    position, count = 0, len(items)
    while position < count or ends:
        if ends and (position == count or ends[0][0] <= items[position][0]):
            now, index = heapq.heappop(ends)
            scheduler.finish(requests[index].id)
            book.finish(requests[index].id, now)
        else:
            now = items[position][0]
            scheduler.submit(requests[position])
            position += 1
        for run in scheduler.take_startable(book.gate(now)):
            index = int(run.id[1:])
            total_wait += now - items[index][0]
            heapq.heappush(ends, (now + items[index][1], index))
    return total_wait / count


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


def best_of(
    repeat: int, contenders: dict[str, Callable[[], float]]
) -> dict[str, tuple[float, float]]:
    """Per contender: (best wall seconds, the mean wait it reported).

    Rounds take turns (one run of each per round), so a machine that gets
    busier half way slows all of them alike.
    """
    times: dict[str, list[float]] = {name: [] for name in contenders}
    waits: dict[str, float] = {}
    for _ in range(repeat):
        for name, fn in contenders.items():
            began = time.perf_counter()
            waits[name] = fn()
            times[name].append(time.perf_counter() - began)
    return {name: (min(times[name]), waits[name]) for name in contenders}


#: What each --cachegrind pass does with the workload it built ("setup": nothing).
PASSES: dict[str, Callable[[list[tuple[float, float]], Workload, LoadedConfig, int], object]] = {
    "setup": lambda items, workload, loaded, slots: None,
    "fast engine": lambda items, workload, loaded, slots: fast_engine(workload, loaded),
    "cores only": lambda items, workload, loaded, slots: cores_only(items, slots),
    "SimPy": lambda items, workload, loaded, slots: simpy_model(items, slots),
}


def child(name: str, runs: int, slots: int) -> None:
    """One --cachegrind pass: build the workload and simulate it with ``name``."""
    items = mmc_arrivals(runs, slots, UTILISATION, mean_duration=MEAN_DURATION)
    workload, loaded = mmc_workload(items, slots)
    PASSES[name](items, workload, loaded, slots)


def cachegrind(runs: int, slots: int, jobs: int) -> None:
    names = [name for name in PASSES if name != "SimPy" or importlib.util.find_spec("simpy")]
    small, per_run = instructions_per_run(__file__, names, runs, slots, jobs)
    print(
        f"M/M/{slots} at {UTILISATION:.0%} utilisation, {runs:,} minus {small:,} runs,"
        f" PYTHONHASHSEED=0; instructions per simulated run (building the workload taken off)"
    )
    setup = per_run["setup"]
    for name in names[1:]:
        print(f"  {name:<16} {per_run[name] - setup:>10,.0f}")
    fast = per_run["fast engine"] - setup
    for name in names[2:]:
        print(f"  fast engine / {name + ':':<14} {(per_run[name] - setup) / fast:.2f}x (speed)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="100000; 30000 with --cachegrind")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cachegrind", action="store_true", help="count instructions")
    parser.add_argument("--jobs", type=int, default=2, help="cachegrind processes at once")
    parser.add_argument("--child", choices=list(PASSES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    if args.child is not None:
        child(args.child, args.runs, args.slots)
        return 0
    if args.cachegrind:
        cachegrind(args.runs or 30_000, args.slots, args.jobs)
        return 0
    args.runs = args.runs or 100_000
    items = mmc_arrivals(args.runs, args.slots, UTILISATION, mean_duration=MEAN_DURATION)
    workload, loaded = mmc_workload(items, args.slots)
    print(
        f"M/M/{args.slots} at {UTILISATION:.0%} utilisation, {args.runs:,} runs,"
        f" best of {args.repeat}"
    )
    contenders: dict[str, Callable[[], float]] = {
        "fast engine": lambda: fast_engine(workload, loaded),
        "cores only": lambda: cores_only(items, args.slots),
        "bare heap loop": lambda: bare_loop(items, args.slots),
    }
    if importlib.util.find_spec("simpy") is not None:
        contenders["SimPy"] = lambda: simpy_model(items, args.slots)
    else:
        print("  (SimPy is not installed: pip install -e '.[bench]')")
    rows = best_of(args.repeat, contenders)
    for name, (seconds, wait) in rows.items():
        rate = args.runs / seconds
        print(f"  {name:<16} {rate:>10,.0f} runs/s   ({seconds:.3f} s, mean wait {wait:.4f} s)")
    fast = args.runs / rows["fast engine"][0]
    print(f"  fast engine / cores only:     {fast / (args.runs / rows['cores only'][0]):.2f}x")
    print(f"  fast engine / bare heap loop: {fast / (args.runs / rows['bare heap loop'][0]):.2f}x")
    if "SimPy" in rows:
        print(f"  fast engine / SimPy:          {fast / (args.runs / rows['SimPy'][0]):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
