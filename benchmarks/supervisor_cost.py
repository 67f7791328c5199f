"""The supervisor's own CPU per run, with no process spawned.

``benchmarks/runtime.py`` measures the whole ``herdsman run``; there the
runner's pipes, fork and exec, and the machine's load blur what the
supervisor itself adds. This runs a real :class:`Supervisor` in this process
on a real SQLite ledger in a temporary folder, with the trace and metrics on,
but with a spawn port that ends every run at once (succeeded, no process):
what is left is intake, the ledger and its commits, the dispatcher, the run
tasks, trace lines, metrics and status bookkeeping.

Runs are submitted ``--batch`` at a time (``submit_many``, as ``POST
/v1/runs/batch`` does) or, with ``--http``, through the API application
(Starlette, driven in process by httpx's ASGI transport: routing, JSON and
the views, no socket), up to 16 requests in flight. It prints runs/s and
CPU per run, in all and in the event-loop thread (the SQLite commits run in
worker threads); with ``--profile`` also the top of a cProfile of one pass.

With ``--instructions`` it counts instructions instead of timing: it runs
itself under valgrind's callgrind (``--separate-threads=yes``) at ``--runs``
runs and at a fifth of that, and prints the difference per run, for the
event-loop thread and for the other threads (the ledger's commits) apart.
The load does not move these counts; the event loop's is the one that
bounds the rate, as it cannot use a second CPU.

Run: python benchmarks/supervisor_cost.py [--runs N] [--batch N] [--http]
     [--repeat N] [--profile | --instructions]
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import os
import pstats
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import trio

from herdsman.config import load_config_text
from herdsman.runtime.api.app import create_app
from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec, RunCancel
from herdsman.runtime.store import NewRun, SqliteStore
from herdsman.runtime.supervisor import Supervisor
from herdsman.trace import TraceWriter
from runtime import submit_runs

CONCURRENCY = 8
TOKEN = "benchmark"
DONE = ProcessOutcome(
    status=Outcome.SUCCEEDED,
    exit_code=0,
    reason=None,
    limit=None,
    result="",
    session_id=None,
    excerpt="",
    usage_limit=None,
)


class EndsAtOnce:
    """The spawn port: a run that succeeds at its first checkpoint, spawning nothing.

    ``all_ran`` is set once ``runs`` runs have been executed, so the
    benchmark need not poll the status (which costs in proportion to the
    runs queued) while they go through.
    """

    def __init__(self, runs: int) -> None:
        self.left = runs
        self.all_ran = trio.Event()

    async def __call__(
        self,
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> ProcessOutcome:
        task_status.started(0)
        await trio.lowlevel.checkpoint()
        self.left -= 1
        if not self.left:
            self.all_ran.set()
        return DONE


class Cost(NamedTuple):
    """Runs/s, and this process's CPU per run: in all, and in the event-loop thread."""

    rate: float
    cpu_ms: float
    loop_ms: float


def config_text() -> str:
    return f"""\
[supervisor]
state_dir = "state"
parallel_preamble = false

[providers.true]
exec = ["/bin/true"]
concurrency = {CONCURRENCY}
"""


async def submit_direct(supervisor: Supervisor, runs: int, batch: int, tag: str) -> None:
    limiter = trio.CapacityLimiter(16)

    async def one(first: int) -> None:
        items = [
            (NewRun(id=f"{tag}{n}", provider="true", prompt="go"), "queue")
            for n in range(first, min(first + batch, runs))
        ]
        async with limiter:
            await supervisor.submit_many(items)  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        for first in range(0, runs, batch):
            nursery.start_soon(one, first)


async def one_pass(runs: int, batch: int, http: bool, profile: cProfile.Profile | None) -> Cost:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        loaded = load_config_text(config_text(), directory / "supervisor.toml")
        config = loaded.config
        store = SqliteStore(directory / "runs.sqlite3")
        trace = TraceWriter(
            directory / "traces",
            max_bytes=1 << 30,
            config={},
            clock=trio.current_time,
            wall=lambda: dt.datetime.now(dt.UTC),
        )
        execute = EndsAtOnce(runs)
        supervisor = Supervisor(config, store, execute=execute, trace=trace)
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(supervisor, TOKEN)),
            base_url="http://herdsman",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(supervisor.run)
                cpu, loop = time.process_time(), time.thread_time()
                began = time.perf_counter()
                if profile is not None:
                    profile.enable()
                if http:
                    await submit_runs(client, runs, batch, "r")
                else:
                    await submit_direct(supervisor, runs, batch, "r")
                await execute.all_ran.wait()
                while supervisor.status()["running"]:  # their finishes being recorded
                    await trio.sleep(0.001)
                if profile is not None:
                    profile.disable()
                elapsed = time.perf_counter() - began
                cost = Cost(
                    runs / elapsed,
                    (time.process_time() - cpu) / runs * 1000,
                    (time.thread_time() - loop) / runs * 1000,
                )
                supervisor.request_shutdown()
        finally:
            await client.aclose()
            trace.close()
            store.close()
        finished = store_count(directory / "runs.sqlite3")
        if finished != runs:
            raise SystemExit(f"only {finished} of {runs} runs were recorded succeeded")
        return cost


def store_count(path: Path) -> int:
    with sqlite3.connect(path) as db:
        (count,) = db.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'").fetchone()
        return int(count)


async def main_async(args: argparse.Namespace) -> None:
    how = "over the ASGI app" if args.http else "submit_many"
    costs = []
    for n in range(args.repeat):
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        profile = cProfile.Profile() if args.profile and n == 0 else None
        cost = await one_pass(args.runs, args.batch, args.http, profile)
        costs.append(cost)
        print(
            f"pass {n + 1} (load {load}): {args.runs} runs, {args.batch} per submit, {how}: "
            f"{cost.rate:6,.0f} runs/s, CPU {cost.cpu_ms:.3f} ms/run, "
            f"event loop {cost.loop_ms:.3f}"
        )
        if profile is not None:
            pstats.Stats(profile).sort_stats(args.sort).print_stats(args.top)
    if args.repeat > 1:
        print(
            f"median of {args.repeat}: CPU {statistics.median(c.cpu_ms for c in costs):.3f} "
            f"ms/run, event loop {statistics.median(c.loop_ms for c in costs):.3f} ms/run"
        )


def thread_instructions(runs: int, batch: int, http: bool) -> tuple[int, int]:
    """Instructions callgrind counts for a pass of ``runs``: (event-loop thread, the others)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        valgrind = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-instr=no"]
        child = [sys.executable, __file__, f"--runs={runs}", f"--batch={batch}", "--repeat=1"]
        completed = subprocess.run(
            [*valgrind, f"--callgrind-out-file={out}", *child, *(["--http"] if http else [])],
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            raise SystemExit(f"callgrind failed:\n{completed.stderr[-2000:]}")
        loop = others = 0
        # One file per thread, callgrind.out-01 the first: trio.run's.
        for path in sorted(Path(folder).glob("callgrind.out-*")):
            found = re.search(r"^summary:\s+(\d+)", path.read_text(), re.MULTILINE)
            if found is None:
                raise SystemExit(f"no instruction count in {path.name}")
            if path.name.endswith("-01"):
                loop += int(found.group(1))
            else:
                others += int(found.group(1))
        return loop, others


def print_instructions(args: argparse.Namespace) -> None:
    small = args.runs // 5
    big_loop, big_others = thread_instructions(args.runs, args.batch, args.http)
    small_loop, small_others = thread_instructions(small, args.batch, args.http)
    how = "over the ASGI app" if args.http else "submit_many"
    print(
        f"{args.runs} minus {small} runs, {args.batch} per submit, {how}; instructions per run: "
        f"event-loop thread {(big_loop - small_loop) / (args.runs - small):,.0f}, "
        f"other threads {(big_others - small_others) / (args.runs - small):,.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=50, help="runs per submit (default 50)")
    parser.add_argument("--http", action="store_true", help="submit through the ASGI app")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile the first pass")
    parser.add_argument("--sort", default="tottime", help="pstats sort key (with --profile)")
    parser.add_argument("--top", type=int, default=40, help="profile lines (with --profile)")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per run under callgrind, by thread (needs valgrind)",
    )
    args = parser.parse_args()
    for name in ("runs", "batch", "repeat", "top"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be 1 or more, not {getattr(args, name)}")
    if args.instructions:
        if args.profile:
            parser.error("--instructions and --profile cannot be used together")
        if args.runs < 5:
            parser.error(f"--runs must be 5 or more with --instructions, not {args.runs}")
        print_instructions(args)
        return
    trio.run(main_async, args)


if __name__ == "__main__":
    main()
