"""Replay speed: ``herdsman sim replay`` against a bare trio + MockClock loop.

The bare loop is the ceiling: one task feeding arrivals, one task per running
run that sleeps its duration behind a CapacityLimiter, on the same clock. The
replay does what the supervisor does for each run (ledger, scheduler, trace,
fake runner) on top. Both handle the same synthetic workload: RUNS runs,
Poisson arrivals, exponential durations, SLOTS slots.

    .venv/bin/python benchmarks/sim_replay.py [--runs 100000] [--slots 8] [--repeat 1]
    .venv/bin/python benchmarks/sim_replay.py --cachegrind [--runs 3000] [--replay-pass]

Each pass prints runs per wall second and per CPU second of the process
(``time.process_time``: what other work on the machine takes of the wall
clock is left out, not what it does to the caches), and the cyclic garbage
collector's share: its collections of the oldest generation and the CPU
time of all its collections (``gc.callbacks``). ``--repeat N`` alternates N
bare and N replay passes, as the wall clock of one pass moves with the load.

``--cachegrind`` counts instructions instead (load-independent): each of
three passes runs in its own process under valgrind's cachegrind
(``PYTHONHASHSEED=0``), at RUNS and RUNS/3 runs; per run is the difference
of the two counts over the difference in runs. ``setup`` only writes and
reads the trace, ``replay`` also replays it (less ``setup``: the replay's
cost), ``bare`` runs the bare loop alone (less its own workload's cost).
``--replay-pass`` counts the replay pass alone, set-up included: the quick
way to compare two trees.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio
import trio.testing

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload
from instructions import instructions_per_run


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


class Pass:
    """What one pass took: wall and CPU seconds, and the garbage collector's part."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.gc_cpu = 0.0
        self.full_collections = 0
        self._began = 0.0

    def _collecting(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.process_time()
            return
        self.gc_cpu += time.process_time() - self._began
        self.full_collections += info["generation"] == 2

    @contextmanager
    def measuring(self) -> Iterator[None]:
        gc.callbacks.append(self._collecting)
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall, self.cpu = time.perf_counter() - wall, time.process_time() - cpu
            gc.callbacks.remove(self._collecting)

    def line(self, name: str, runs: int, bare: Pass | None = None) -> str:
        share = ""
        if bare is not None:
            share = (
                f" ({100 * bare.wall / self.wall:.0f}% of the bare loop's wall rate,"
                f" {100 * bare.cpu / self.cpu:.0f}% of its CPU rate)"
            )
        return (
            f"{name:<29} {runs / self.wall:>7,.0f} runs per wall second,"
            f" {runs / self.cpu:>7,.0f} per CPU second{share};"
            f" gc {self.gc_cpu:.2f} s CPU, {self.full_collections} full"
        )


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


def child(name: str, runs: int, slots: int) -> None:
    """One cachegrind pass: build the workload and do ``name`` with it."""
    items = workload(runs, slots)
    if name in ("bare", "bare-setup"):
        if name == "bare":
            bare_loop(items, slots)
        return
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.jsonl"
        write_trace(trace, items, slots)
        loaded_workload = read_workload(trace)
        loaded = config_from_trace(loaded_workload.header.config, "header")
        if name == "replay":
            replay(loaded_workload, loaded)


def cachegrind(runs: int, slots: int, jobs: int, *, replay_pass: bool = False) -> None:
    if replay_pass:
        # Two processes instead of eight: enough to compare two trees, whose
        # set-up (the same in both) is not taken off.
        small, per_run = instructions_per_run(__file__, ("replay",), runs, slots, jobs)
        print(
            f"{runs:,} minus {small:,} runs, {slots} slots, PYTHONHASHSEED=0; instructions per run"
        )
        print(f"replay pass, trace set-up included: {per_run['replay']:>11,.0f}")
        return
    names = ("setup", "replay", "bare-setup", "bare")
    small, per_run = instructions_per_run(__file__, names, runs, slots, jobs)
    setup = per_run["setup"]
    replayed = per_run["replay"] - setup
    bare = per_run["bare"] - per_run["bare-setup"]
    print(f"{runs:,} minus {small:,} runs, {slots} slots, PYTHONHASHSEED=0; instructions per run")
    print(f"writing and reading the trace: {setup:>11,.0f}  (taken off the replay)")
    print(f"bare trio + MockClock loop:    {bare:>11,.0f}")
    share = 100 * bare / replayed
    print(f"herdsman sim replay:           {replayed:>11,.0f}  bare loop's share {share:.0f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="100000; 3000 with --cachegrind")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--cachegrind", action="store_true", help="count instructions")
    parser.add_argument("--jobs", type=int, default=2, help="cachegrind processes at once")
    parser.add_argument(
        "--replay-pass",
        action="store_true",
        help="with --cachegrind: the replay pass alone, set-up included (to compare trees)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="bare and replay passes, alternated")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay_pass and not args.cachegrind:
        parser.error("--replay-pass counts instructions: give it with --cachegrind")
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    if args.child is not None:
        child(args.child, args.runs, args.slots)
        return
    if args.cachegrind:
        cachegrind(args.runs or 3000, args.slots, args.jobs, replay_pass=args.replay_pass)
        return
    args.runs = args.runs or 100_000
    wall_clock(args.runs, args.slots, args.repeat)


def wall_clock(runs: int, slots: int, repeat: int) -> None:
    items = workload(runs, slots)
    print(f"{runs:,} runs, {slots} slots, 80% utilisation; load average {os.getloadavg()[0]:.1f}")
    replayed = None
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.jsonl"
        write_trace(trace, items, slots)
        for _ in range(repeat):
            gc.collect()
            bare = Pass()
            with bare.measuring():
                bare_loop(items, slots)
            print(bare.line("bare trio + MockClock loop:", runs))
            replayed = None
            loaded_workload = read_workload(trace)
            loaded = config_from_trace(loaded_workload.header.config, "header")
            # The last pass's ledger is cyclic garbage: collected now, not in this pass.
            gc.collect()
            passed = Pass()
            with passed.measuring():
                replayed = replay(loaded_workload, loaded)
            print(passed.line("herdsman sim replay:", replayed.runs, bare))
            print(
                f"{'':<29} replay() says {replayed.runs / replayed.wall_seconds:,.0f} runs per"
                f" wall second; peak RSS {peak_rss():,.0f} MiB"
            )
            sys.stdout.flush()


def peak_rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main()
