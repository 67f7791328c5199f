"""Throughput and latency through the whole supervisor, next to raw process spawning.

Prints, in one run on this machine:
  * raw ``trio.run_process`` of a command that exits at once, at concurrency 8;
  * the runner alone: ``execute()`` of the same command, same concurrency, in
    this process (no HTTP, no ledger): the runner's own overhead;
  * runs per second through ``herdsman run`` (a separate process): submit over
    HTTP -> SQLite ledger -> spawn -> finish, same command, concurrency 8,
    measured from the first submit to the last finish (the ledger's times);
  * submit-to-spawn latency with a free slot (p50, p99): the child prints the
    time it was exec'd; the client noted the time just before its POST;
  * for scale, the same HTTP stack (hypercorn + Starlette) answering a
    hello-world route, with the same client: the ceiling for one request per run.

CPU is given per run, in all (worker threads included) and in the event-loop
thread alone: that thread is the one that cannot use the second CPU, so its
time per run bounds the rate. For the supervisor it is also split by thread:
the event loop, the spawn jobs and the ledger's commits (what their calls
used in worker threads, from ``GET /metrics``), and the rest (the hand-off
to and from those threads, other threads), with the wall time the spawn
jobs and commits took in their threads and the context switches per run of
the event loop and of the other threads; and how long a run held its slot,
from its start to its finish in the ledger. Other load on the machine moves
the rates much more than the CPU times.

With ``--store-url URL`` the supervisor keeps its ledger in PostgreSQL at URL
(an empty database or schema; the password, if any, from PGPASSWORD or
~/.pgpass) instead of SQLite in its state directory.

With ``--repeat N`` everything is measured N times (a fresh supervisor each
time) and the medians are printed, each rate as a share of the raw rate of
its own pass: on a shared machine the ratios move much less than the rates.
Each pass prints the load average before it.

Run: python benchmarks/runtime.py [--runs N] [--latency-samples N] [--runner-only]
     [--store-url URL] [--repeat N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from file_create import create
from herdsman.runtime.runner import Outcome, ProcessSpec, execute

CONCURRENCY = 8
TRUE = "/bin/true"
DATE = "/bin/date"


class Cost(NamedTuple):
    """Runs/s, and this process's CPU per run: in all, and in the event-loop thread."""

    rate: float
    cpu_ms: float
    loop_ms: float


async def measure(runs: int, one: Callable[[int], Awaitable[None]]) -> Cost:
    """Run ``one(0)`` .. ``one(runs - 1)`` at once (``one`` limits itself); the cost."""
    cpu_before, loop_before = time.process_time(), time.thread_time()
    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for n in range(runs):
            nursery.start_soon(one, n)
    elapsed = time.perf_counter() - began
    return Cost(
        rate=runs / elapsed,
        cpu_ms=(time.process_time() - cpu_before) / runs * 1000,
        loop_ms=(time.thread_time() - loop_before) / runs * 1000,
    )


async def raw_spawn_rate(runs: int) -> Cost:
    """Bare ``trio.run_process`` of TRUE with a short stdin."""
    limiter = trio.CapacityLimiter(CONCURRENCY)

    async def one(_: int) -> None:
        async with limiter:
            await trio.run_process([TRUE], stdin=b"prompt")

    return await measure(runs, one)


async def runner_rate(runs: int, directory: Path) -> Cost:
    """``execute()`` of TRUE alone: no HTTP, no ledger.

    The spec is what the supervisor builds for a provider with the default
    limits (no wall-clock timeout, a 15-minute idle timeout): the ambient
    environment, a short prompt, a log file per run.
    """
    limiter = trio.CapacityLimiter(CONCURRENCY)
    env = dict(os.environ)

    async def one(n: int) -> None:
        spec = ProcessSpec(
            argv=(TRUE,),
            env=env,
            cwd=directory,
            prompt="go",
            timeout=None,
            idle_timeout=900.0,
            log_path=directory / "logs" / f"r{n}.log",
            protocol="plain",
        )
        async with limiter:
            outcome = await execute(spec)
        if outcome.status is not Outcome.SUCCEEDED:
            raise SystemExit(f"run {n} did not succeed: {outcome}")

    return await measure(runs, one)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_config(directory: Path, port: int, store_url: str | None = None) -> Path:
    path = directory / "supervisor.toml"
    store = "" if store_url is None else f'\n[store]\nurl = "{store_url}"\n'
    path.write_text(
        f"""\
[supervisor]
state_dir = "state"
parallel_preamble = false

[providers.true]
exec = ["{TRUE}"]
concurrency = {CONCURRENCY}

[providers.date]
exec = ["{DATE}", "+%s.%N"]
concurrency = 1

[api]
listen = "127.0.0.1:{port}"
{store}"""
    )
    return path


def start_supervisor(directory: Path) -> subprocess.Popen[bytes]:
    log = (directory / "supervisor.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "herdsman",
            "run",
            "-c",
            "supervisor.toml",
            "--log-level",
            "warning",
        ],
        cwd=directory,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    token = directory / "state" / "api-token"
    deadline = time.monotonic() + 30
    while not token.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit((directory / "supervisor.log").read_text())
        time.sleep(0.05)
    return process


async def wait_ready(
    client: httpx.AsyncClient, process: subprocess.Popen[bytes], directory: Path
) -> None:
    """Until the supervisor's API answers; its log, and an exit, if it never does.

    On a loaded machine a supervisor has failed to answer within the limit;
    the log, deleted with the scratch folder, is the only way to see why.
    """
    deadline = trio.current_time() + 30
    while trio.current_time() < deadline and process.poll() is None:
        try:
            if (await client.get("/v1/status")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await trio.sleep(0.05)
    state = "exited with " + str(process.returncode) if process.poll() is not None else "no answer"
    log = (directory / "supervisor.log").read_text(errors="replace")
    raise SystemExit(f"the supervisor's API did not answer within 30 s ({state}); its log:\n{log}")


class Threads(NamedTuple):
    """What the supervisor has spent so far: CPU seconds, by thread; wall time
    of the spawn jobs and the ledger commits in their threads; context switches."""

    cpu: float
    loop: float
    spawn: float
    ledger: float
    spawn_wall: float
    ledger_wall: float
    loop_switches: int
    other_switches: int

    def per_run(self, before: Threads, runs: int) -> str:
        """The CPU and wall ms and context switches per run since ``before``, as printed."""
        ms = [(now - then) / runs * 1000 for now, then in zip(self[:6], before[:6], strict=True)]
        cpu, loop, spawn, ledger, spawn_wall, ledger_wall = ms
        switches = [(now - then) / runs for now, then in zip(self[6:], before[6:], strict=True)]
        return (
            f"supervisor CPU {cpu:.2f} ms/run: event loop {loop:.2f}, spawn jobs {spawn:.2f}, "
            f"ledger commits {ledger:.2f}, the rest {cpu - loop - spawn - ledger:.2f}\n"
            f"  wall time in worker threads per run: spawn jobs {spawn_wall:.2f} ms, "
            f"ledger commits {ledger_wall:.2f} ms; context switches per run: "
            f"event loop {switches[0]:.1f}, other threads {switches[1]:.1f}"
        )


async def supervisor_threads(client: httpx.AsyncClient, pid: int) -> Threads:
    """What the supervisor ``pid`` has spent so far (its pools' times from its /metrics)."""
    pools = {
        (name, pool): 0.0 for name in ("cpu_seconds", "seconds") for pool in ("spawn", "ledger")
    }
    response = await client.get("/metrics")
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            name = sample.name.removeprefix("herdsman_worker_thread_").removesuffix("_total")
            if (name, sample.labels.get("pool")) in pools:
                pools[name, sample.labels["pool"]] = sample.value
    loop_switches = other_switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            status = (task / "status").read_text().splitlines()
            switches = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
            if task.name == str(pid):
                loop_switches += switches
            else:
                other_switches += switches
    return Threads(
        cpu_seconds(pid),
        cpu_seconds(pid, main_thread=True),
        pools["cpu_seconds", "spawn"],
        pools["cpu_seconds", "ledger"],
        pools["seconds", "spawn"],
        pools["seconds", "ledger"],
        loop_switches,
        other_switches,
    )


def cpu_seconds(pid: int, *, main_thread: bool = False) -> float:
    """User + system CPU time of a process (or its main thread) so far, children excluded."""
    stat = Path(f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat")
    fields = stat.read_text().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


async def submit_runs(client: httpx.AsyncClient, runs: int, batch: int, tag: str) -> None:
    """Submit runs ``tag0``.. of provider ``true``, ``batch`` a request, 16 requests in flight."""
    limiter = trio.CapacityLimiter(16)

    async def submit(first: int) -> None:
        body = [
            {"provider": "true", "prompt": "go", "id": f"{tag}{n}"}
            for n in range(first, min(first + batch, runs))
        ]
        async with limiter:
            if batch == 1:
                response = await client.post("/v1/runs", json=body[0])
            else:
                response = await client.post("/v1/runs/batch", json={"runs": body})
            response.raise_for_status()

    async with trio.open_nursery() as nursery:
        for first in range(0, runs, batch):
            nursery.start_soon(submit, first)


class Supervised(NamedTuple):
    """Runs/s through the supervisor, and how long each run held its slot."""

    rate: float
    held_p50_ms: float
    held_p90_ms: float
    slots_busy: float

    def __str__(self) -> str:
        return (
            f"a run holds its slot from its start to its finish: p50 {self.held_p50_ms:.1f} ms, "
            f"p90 {self.held_p90_ms:.1f} ms; {self.slots_busy:.2f} of {CONCURRENCY} slots "
            "busy on average"
        )


async def supervised_rate(client: httpx.AsyncClient, runs: int, batch: int, tag: str) -> Supervised:
    """Submit ``runs`` runs (see :func:`submit_runs`) and wait for them; the rate, and
    how long the runs held their slots.

    With every slot busy all the time, the rate is the slots over the time
    a run holds one (the ledger's start to finish: the durable start, the
    spawn, the child, its end): the held times say where the rate goes.
    """
    await submit_runs(client, runs, batch, tag)
    # Poll the status rather than each run, so the measurement does not add
    # a request per run to the supervisor's load.
    while True:
        status = (await client.get("/v1/status")).json()
        if status["queued"] == 0 and status["running"] == 0:
            break
        await trio.sleep(0.2)
    response = await client.get("/v1/runs", params={"limit": runs})
    records = [r for r in response.json()["runs"] if r["id"].startswith(tag)]
    failed = [r for r in records if r["status"] != "succeeded"]
    if failed or len(records) != runs:
        raise SystemExit(f"{len(failed)} of {len(records)} runs did not succeed: {failed[:1]}")
    span: float = max(r["finished_at"] for r in records) - min(r["submitted_at"] for r in records)
    held = [r["finished_at"] - r["started_at"] for r in records]
    running = max(r["finished_at"] for r in records) - min(r["started_at"] for r in records)
    deciles = statistics.quantiles(held, n=10)
    return Supervised(
        runs / span, statistics.median(held) * 1000, deciles[8] * 1000, sum(held) / running
    )


async def spawn_latencies(client: httpx.AsyncClient, samples: int, tag: str) -> list[float]:
    latencies = []
    for n in range(samples):
        before = time.time()
        run_id = f"{tag}{n}"
        response = await client.post(
            "/v1/runs", json={"provider": "date", "prompt": "go", "id": run_id}
        )
        response.raise_for_status()
        done = (await client.get(f"/v1/runs/{run_id}", params={"wait": 30})).json()
        spawned = float(done["result"])
        latencies.append((spawned - before) * 1000)
        await trio.sleep(0.01)
    return latencies


HELLO_SERVER = """
import sys, trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def hello(request):
    return JSONResponse({"ok": True})

config = Config()
config.bind = [sys.argv[1]]
config.accesslog = None
trio.run(serve, Starlette(routes=[Route("/", hello)]), config)
"""


async def hello_world_rate(requests: int) -> tuple[float, float]:
    """Requests/s and server CPU ms per request of a bare hello-world app."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", HELLO_SERVER, f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            with trio.fail_after(30):
                while True:
                    try:
                        await client.get("/")
                        break
                    except httpx.TransportError:
                        await trio.sleep(0.05)
            limiter = trio.CapacityLimiter(16)

            async def one() -> None:
                async with limiter:
                    (await client.get("/")).raise_for_status()

            cpu_before = cpu_seconds(server.pid)
            began = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(requests):
                    nursery.start_soon(one)
            elapsed = time.perf_counter() - began
            cpu = (cpu_seconds(server.pid) - cpu_before) / requests * 1000
        return requests / elapsed, cpu
    finally:
        server.terminate()
        server.wait()


class Pass(NamedTuple):
    """One pass's rates as fractions of its raw rate, and its latency p50 (ms)."""

    raw: float
    runner: float
    one_per_request: float | None
    batched: float | None
    p50: float | None


async def one_pass(
    runs: int, samples: int, runner_only: bool, store_url: str | None, tag: str, *, scratch: Path
) -> Pass:
    """Measure everything once (runs are tagged ``tag`` so passes never share ids).

    Everything the pass writes stays in ``scratch`` until the whole benchmark
    is over: see :func:`main_async`.
    """
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average before this pass: {load}")
    print(f"creating an empty file here: {create(scratch / 'files', 200):.0f} us of CPU")
    raw = await raw_spawn_rate(runs)
    print(
        f"raw trio.run_process({TRUE}), concurrency {CONCURRENCY}: {raw.rate:8,.0f} runs/s "
        f"(CPU {raw.cpu_ms:.2f} ms/run, event loop {raw.loop_ms:.2f})"
    )
    (scratch / "runner").mkdir()
    runner = await runner_rate(runs, scratch / "runner")
    print(
        f"runner only: execute({TRUE}), concurrency {CONCURRENCY}: {runner.rate:6,.0f} runs/s "
        f"({runner.rate / raw.rate:.0%} of raw; CPU {runner.cpu_ms:.2f} ms/run, "
        f"event loop {runner.loop_ms:.2f})"
    )
    if runner_only:
        return Pass(raw.rate, runner.rate / raw.rate, None, None, None)
    ratios: dict[int, float] = {}
    directory = scratch / "supervisor"
    directory.mkdir()
    port = free_port()
    write_config(directory, port, store_url)
    process = await trio.to_thread.run_sync(start_supervisor, directory)
    try:
        token = (directory / "state" / "api-token").read_text().strip()
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=180,
        ) as client:
            await wait_ready(client, process, directory)
            for batch, kind in ((1, "s"), (50, "b")):
                before = await supervisor_threads(client, process.pid)
                supervised = await supervised_rate(client, runs, batch, f"{kind}{tag}")
                after = await supervisor_threads(client, process.pid)
                rate = supervised.rate
                ratios[batch] = rate / raw.rate
                how = "one run per request" if batch == 1 else f"{batch} runs per request"
                how += "" if store_url is None else ", PostgreSQL ledger"
                print(
                    f"herdsman run, submit over HTTP ({how}) -> finish: {rate:6,.0f} runs/s "
                    f"({rate / raw.rate:.0%} of raw)\n  {after.per_run(before, runs)}\n"
                    f"  {supervised}"
                )
            lat = await spawn_latencies(client, samples, f"d{tag}")
            quantiles = statistics.quantiles(lat, n=100)
            print(
                f"submit-to-spawn latency, free slot ({samples} samples): "
                f"p50 {statistics.median(lat):.1f} ms, p99 {quantiles[98]:.1f} ms"
            )
    finally:
        process.send_signal(signal.SIGTERM)
        await trio.to_thread.run_sync(process.wait)
    rate, cpu = await hello_world_rate(runs)
    print(
        f"for scale: hypercorn + Starlette hello world:  {rate:8,.0f} requests/s "
        f"(server CPU {cpu:.2f} ms/request)"
    )
    return Pass(raw.rate, runner.rate / raw.rate, ratios[1], ratios[50], statistics.median(lat))


def summarise(passes: list[Pass]) -> None:
    """Medians over the passes: each rate as a share of the raw rate of its own pass."""

    def median(values: list[float | None]) -> float:
        return statistics.median(v for v in values if v is not None)

    print(f"medians of {len(passes)} passes (each pass against its own raw rate):")
    print(f"  raw {median([p.raw for p in passes]):,.0f} runs/s")
    print(f"  runner only {median([p.runner for p in passes]):.0%} of raw")
    if passes[0].batched is not None:
        print(
            f"  whole supervisor {median([p.one_per_request for p in passes]):.0%} of raw "
            f"(one run per request), {median([p.batched for p in passes]):.0%} "
            "(50 runs per request)"
        )
        print(f"  submit-to-spawn p50 {median([p.p50 for p in passes]):.1f} ms")


async def main_async(
    runs: int, samples: int, runner_only: bool, store_url: str | None, repeat: int
) -> None:
    passes = []
    # Nothing is deleted until the end. On this machine's ext4, creating a
    # file (every run creates its log) costs 13-440 us of CPU, most right
    # after thousands were deleted (perf puts the time in the inode
    # allocator), and the deletions of a pass's logs used to land on the
    # measurement after them. Each pass prints what creating a file costs
    # at its start; benchmarks/file_create.py shows the effect alone.
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(repeat):
            if repeat > 1:
                print(f"-- pass {n + 1} of {repeat}")
            scratch = Path(tmp) / str(n)
            scratch.mkdir()
            passes.append(
                await one_pass(runs, samples, runner_only, store_url, f"{n}x", scratch=scratch)
            )
    if repeat > 1:
        summarise(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=1000, help="at most 1000 (any number with --runner-only)"
    )
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure N times (a fresh supervisor each time) and print the medians of the ratios",
    )
    parser.add_argument(
        "--runner-only",
        action="store_true",
        help="measure raw spawning and execute() only, without starting a supervisor",
    )
    parser.add_argument(
        "--store-url",
        help="keep the supervisor's ledger in this PostgreSQL database (empty) instead of SQLite",
    )
    args = parser.parse_args()
    if args.runs <= 0 or (args.runs > 1000 and not args.runner_only):
        parser.error("--runs must be from 1 to 1000 (the API lists at most 1000 runs)")
    if args.repeat <= 0:
        parser.error(f"--repeat must be 1 or more, not {args.repeat}")
    print(f"{os.cpu_count()} CPUs")
    trio.run(
        main_async,
        args.runs,
        args.latency_samples,
        args.runner_only,
        args.store_url,
        args.repeat,
    )


if __name__ == "__main__":
    main()
