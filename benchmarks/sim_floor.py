"""The replay's floor: the bare trio + MockClock loop plus each piece a full-fidelity replay needs.

``sim_replay.py`` compares ``herdsman sim replay`` with a bare loop (one task
per run sleeping its duration behind a CapacityLimiter). This script
measures, on the same workload and in the same process, what that bare
loop costs once each piece the issue makes mandatory is added: one at a
time on top of the bare loop, then cumulatively, then the replay itself.
Each piece uses the real component with the arguments the supervisor
gives it:

* trace      the output trace: TraceWriter writing the replay's own submit,
             start and finish lines to an in-memory sink;
* scheduler  the scheduler core's decisions in place of the CapacityLimiter
             (a run's task is spawned when the core starts it);
* ledger     the in-memory ledger's records (MemoryStore submit,
             mark_running_many, finish with the supervisor's finish fields);
* accounts   the account core: a pick per start, its release at the finish;
* task       the supervisor's shape of a run's task: a cancel handle, the
             runner called as its own coroutine, the finish recorded after
             the check that it awaits nothing (as with the inline ledger);
* driver     the replay's determinism by construction: one driver task
             delivers every arrival and every run's end from a heap keyed
             by (time, kind, order) and lets all tasks block after each
             (the replay's own Driver and drive());
* fakefs     everything inside pyfakefs's Patcher, as the replay runs.

    .venv/bin/python benchmarks/sim_floor.py [--runs 20000] [--slots 8]
    .venv/bin/python benchmarks/sim_floor.py --cachegrind [--runs 3000] [--only "all;trace,ledger"]

``--cachegrind`` runs each configuration in its own process under
valgrind's cachegrind, at RUNS and RUNS/3 runs, and prints instructions per
run: the difference of the two counts over the difference in runs, less the
same difference for a pass that builds the workload and runs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import logging
import math
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import trio
import trio.testing
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.config.report import config_as_json
from herdsman.core import Scheduler
from herdsman.runtime.accounts import account_book
from herdsman.runtime.launch import log_file
from herdsman.runtime.requests import limits_of, run_request, trace_run
from herdsman.runtime.runner import ProcessOutcome, RunCancel
from herdsman.runtime.store import MemoryStore, NewRun
from herdsman.runtime.supervisor import finish_fields
from herdsman.sim.driver import ARRIVAL, Driver, drive
from herdsman.sim.fake_end import fake_end
from herdsman.sim.replay import replay
from herdsman.sim.workload import Attempt, Workload, config_from_trace, read_workload
from herdsman.trace import TraceWriter
from sim_replay import instructions_per_run, write_trace
from sim_replay import workload as make_items

PIECES = ("trace", "scheduler", "ledger", "accounts", "task", "driver", "fakefs")
#: What a configuration name may be besides a comma-separated list of pieces.
SPECIAL = ("setup", "bare", "all", "replay")

# The replay's fake-runner outcome for every run (the workload's runs all succeed).
SUCCEEDED = fake_end(Attempt(0.0, "succeeded", 0), None)


class Floor:
    """One pass of the loop with the given pieces, over one workload."""

    def __init__(self, workload: Workload, pieces: frozenset[str], slots: int) -> None:
        self.pieces = pieces
        self.slots = slots
        self.workload = workload
        self.config = config_from_trace(workload.header.config, "header").config
        self.clock = trio.testing.MockClock(autojump_threshold=0)
        self.sink = io.StringIO()
        now = self.clock.current_time
        self.now = now
        self.trace = TraceWriter(
            Path("/herdsman-sim/traces"),
            max_bytes=1 << 62,
            sink=self.sink,
            config=config_as_json(self.config),
            clock=now,
            wall=lambda: dt.datetime.fromtimestamp(workload.started_at + now(), dt.UTC),
        )
        self.scheduler = Scheduler(
            limits_of(self.config), agent_exclusive=self.config.scheduling.agent_exclusive
        )
        self.book = account_book(self.config)
        self.store = MemoryStore()
        self.state_dir = self.config.supervisor.state_dir
        self.handles: dict[str, RunCancel] = {}
        plans = workload.plans.items()
        self.durations = {run_id: plan.attempts[0].duration for run_id, plan in plans}
        self.driver = Driver(workload)
        self.nursery: trio.Nursery | None = None
        self.limiter: trio.CapacityLimiter | None = None
        self.finished = trio.Event()  # drive() reads it: never set, the input ends first
        self.account_recheck_at: float | None = None

    def wall(self) -> float:
        return self.workload.started_at + self.now()

    # -- what the supervisor does at a submit, a start and a finish ----------------

    def submit(self, order: int, run_id: str) -> None:
        new = NewRun(id=run_id, provider="p", prompt="(not recorded)", workspace="default")
        if "ledger" in self.pieces:
            self.store.submit(new, self.wall())
        if "trace" in self.pieces:
            self.trace.event("submit", run=trace_run(new, with_prompt=False))
        if "scheduler" in self.pieces:
            self.scheduler.submit(run_request(new))
            self.take_starts()
        else:
            assert self.nursery is not None
            self.nursery.start_soon(self.limited, order, run_id)

    def take_starts(self) -> None:
        now = self.wall()
        gate = self.book.gate(now) if "accounts" in self.pieces else None
        for run in self.scheduler.take_startable(gate):
            account = gate.picks[run.id].account if gate is not None else None
            self.start(run.id, account, now)

    def start(self, run_id: str, account: str | None, now: float) -> None:
        if "ledger" in self.pieces:
            self.store.mark_running_many([(run_id, account)], now)
        if "trace" in self.pieces:
            self.trace.event("start", run_id=run_id, account=account)
        if "scheduler" in self.pieces:
            assert self.nursery is not None
            self.nursery.start_soon(self.run_task, run_id, name=f"run {run_id}")

    def finish(self, run_id: str) -> None:
        now = self.wall()
        if "ledger" in self.pieces:
            end = finish_fields(SUCCEEDED, log_file(self.state_dir, run_id))
            self.store.finish(run_id, end, now)
        if "accounts" in self.pieces:
            self.book.finish(run_id, now)
        if "trace" in self.pieces:
            self.trace.event("finish", run_id=run_id, outcome="succeeded", exit_code=0)
        if "scheduler" in self.pieces:
            self.scheduler.finish(run_id)
            self.take_starts()

    # -- the tasks ---------------------------------------------------------------------

    async def limited(self, order: int, run_id: str) -> None:
        """Without the scheduler core: the bare loop's task, waiting for a slot."""
        assert self.limiter is not None
        async with self.limiter:
            account = None
            if "accounts" in self.pieces:
                now = self.wall()
                pick = self.book.pick("p", None, now)
                assert pick is not None
                account = pick.account
                self.book.start(run_id, "p", account, now)
            self.start(run_id, account, self.wall())
            await self.run_task(run_id)

    async def run_task(self, run_id: str) -> None:
        if "task" not in self.pieces:
            await self.wait_out(run_id)
            self.finish(run_id)
            return
        handle = self.handles[run_id] = RunCancel()
        try:
            ended = await self.execute(run_id, handle)
        finally:
            going_down = trio.current_effective_deadline() == -math.inf
            # As the supervisor records a finish with an inline ledger: checked
            # to await nothing, so unshielded.
            with trio.testing.assert_no_checkpoints():
                del self.handles[run_id]
                if not going_down:
                    assert ended is SUCCEEDED
                    self.finish(run_id)

    async def execute(self, run_id: str, cancel: RunCancel) -> ProcessOutcome:
        """The replay's fake runner, less the spec: attach the handle, wait, detach."""
        cancel._attach(lambda reason: None)
        try:
            await self.wait_out(run_id)
        finally:
            cancel._detach()
        return SUCCEEDED

    async def wait_out(self, run_id: str) -> None:
        """The run's recorded duration: slept, or ended by the driver."""
        duration = self.durations[run_id]
        if "driver" not in self.pieces:
            await trio.sleep(duration)
            return
        done = trio.Event()

        async def end() -> None:
            done.set()

        self.driver.push(trio.current_time() + duration, 0, int(run_id[1:]), end)
        await done.wait()

    async def main(self) -> None:
        self.limiter = trio.CapacityLimiter(self.slots)
        self.trace.open()
        arrivals = [(a.t, a.fields["run"]["id"]) for a in self.workload.arrivals]
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            if "driver" not in self.pieces:
                for order, (t, run_id) in enumerate(arrivals):
                    await trio.sleep_until(t)
                    self.submit(order, run_id)
                return
            feed = iter(enumerate(arrivals))

            def next_arrival() -> None:
                item = next(feed, None)
                if item is None:
                    return
                order, (t, run_id) = item

                async def deliver() -> None:
                    self.submit(order, run_id)
                    next_arrival()

                self.driver.push(t, ARRIVAL, order, deliver)

            next_arrival()
            self.driver.driving = True
            await drive(self.driver, self, self.clock)

    def run(self) -> float:
        """Run the pass; its wall seconds."""
        began = time.perf_counter()
        with Patcher() if "fakefs" in self.pieces else contextlib.nullcontext():
            trio.run(self.main, clock=self.clock)
        return time.perf_counter() - began


def build_workload(runs: int, slots: int, folder: Path) -> Workload:
    """The benchmark's workload, as sim_replay.py writes and reads it."""
    trace = folder / "trace.jsonl"
    write_trace(trace, make_items(runs, slots), slots)
    return read_workload(trace)


def parse_configuration(name: str) -> frozenset[str]:
    """The pieces of a configuration name ("bare", "all", or pieces joined by ",")."""
    if name == "bare":
        return frozenset()
    if name == "all":
        return frozenset(PIECES)
    pieces = frozenset(name.split(","))
    unknown = sorted(pieces - set(PIECES))
    if unknown:
        raise SystemExit(
            f"sim_floor.py: unknown piece(s) {', '.join(unknown)} in {name!r};"
            f" pieces are {', '.join(PIECES)}, or a whole configuration: {', '.join(SPECIAL)}"
        )
    return pieces


def configurations() -> Iterator[tuple[str, str]]:
    """(name, label) of every configuration, in the order they are printed."""
    yield "bare", "bare loop"
    for piece in PIECES:
        yield piece, f"bare + {piece}"
    for n in range(2, len(PIECES)):
        yield ",".join(PIECES[:n]), "  + " + PIECES[n - 1]
    yield "all", "  + " + PIECES[-1] + " (all pieces)"
    yield "replay", "herdsman sim replay"


def run_one(name: str, workload: Workload, slots: int) -> float:
    """Wall seconds of one configuration's pass (``setup`` runs nothing)."""
    if name == "setup":
        return 0.0
    if name == "replay":
        loaded = config_from_trace(workload.header.config, "header")
        return replay(workload, loaded).wall_seconds
    return Floor(workload, parse_configuration(name), slots).run()


def wall_clock(runs: int, slots: int, only: list[str] | None, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        workload = build_workload(runs, slots, Path(folder))
        print(
            f"{runs:,} runs, {slots} slots, 80% utilisation; runs per wall second, best of {repeat}"
        )
        bare: float | None = None
        for name, label in configurations():
            if only is not None and name not in only and name != "bare":
                continue
            rate = runs / min(run_one(name, workload, slots) for _ in range(repeat))
            bare = rate if bare is None else bare
            print(f"{label:<34} {rate:>9,.0f}  {100 * rate / bare:>4.0f}% of the bare loop")
            sys.stdout.flush()


def cachegrind(runs: int, slots: int, only: list[str] | None, jobs: int) -> None:
    names = ["setup"] + [
        name for name, _ in configurations() if only is None or name in only or name == "bare"
    ]
    small, per_run = instructions_per_run(__file__, names, runs, slots, jobs)
    setup = per_run["setup"]
    print(f"{runs:,} minus {small:,} runs, {slots} slots, PYTHONHASHSEED=0; instructions per run")
    print(f"{'(building and reading the workload)':<34} {setup:>11,.0f}  (taken off every line)")
    bare: float | None = None
    for name, label in configurations():
        if name not in names:
            continue
        count = per_run[name] - setup
        bare = count if bare is None else bare
        print(f"{label:<34} {count:>11,.0f}  bare loop's share {100 * bare / count:>4.0f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="20000; 3000 with --cachegrind")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="passes per configuration (best)")
    parser.add_argument("--cachegrind", action="store_true", help="count instructions")
    parser.add_argument("--jobs", type=int, default=2, help="cachegrind processes at once")
    parser.add_argument(
        "--only",
        type=lambda text: text.split(";"),
        default=None,
        help="configurations to run, ';'-separated (bare always runs)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    for name in args.only or ():
        if name not in SPECIAL:
            parse_configuration(name)
    if args.child is not None:
        with tempfile.TemporaryDirectory() as folder:
            run_one(args.child, build_workload(args.runs, args.slots, Path(folder)), args.slots)
        return
    if args.cachegrind:
        cachegrind(args.runs or 3000, args.slots, args.only, args.jobs)
    else:
        wall_clock(args.runs or 20_000, args.slots, args.only, args.repeat)


if __name__ == "__main__":
    main()
