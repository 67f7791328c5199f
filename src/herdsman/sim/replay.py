"""Full-fidelity replay: the real supervisor on a fake clock, disk, store, git and runner.

Determinism by construction. One driver task owns every external event — an
arrival from the trace, the end of a fake run — in a heap keyed by ``(time,
kind, sequence)``, where the sequence comes from the trace (arrival order,
attempt number), never from which task woke first. The driver delivers one
event at a time and then waits until every task is blocked
(``trio.testing.wait_all_tasks_blocked``, or riding along with the tasks
the event woke until none is left to run) before the next, so whatever one
event sets off has finished before the next begins. Between events it moves
the ``MockClock`` itself, to the next event or to the supervisor's own next
timer if that comes first (so a timer due at an event's instant acts before
it). Nothing is decided by trio's wake-up order, which ``--seed`` reshuffles
to prove it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.config import Config, LoadedConfig
from herdsman.runtime.git.fake import FakeGit
from herdsman.runtime.ledger import Inline, inline
from herdsman.runtime.metrics import Uncounted
from herdsman.runtime.store import MemoryStore, NewRun, Store
from herdsman.runtime.supervisor import (
    NotAdmitting,
    RunConflict,
    RunNotFound,
    Supervisor,
    UnknownAccount,
)
from herdsman.sim.bounds import WALL_LIMIT, run_watched
from herdsman.sim.collector import young_collections_rarer
from herdsman.sim.driver import ARRIVAL, Driven, Driver, drive
from herdsman.sim.result import ReplayResult, recording_ends, summary
from herdsman.sim.trio_internals import (
    mock_time,
    plain_instruments,
    shuffle_trio,
)
from herdsman.sim.workload import (
    CARRIED_REST,
    DEFAULT_DURATION,
    Arrival,
    Workload,
    config_from_trace,
)
from herdsman.trace import TraceWriter

__all__ = [
    "ARRIVAL",
    "DEFAULT_DURATION",
    "Driven",
    "Driver",
    "ReplayResult",
    "deliver_arrival",
    "drive",
    "new_run",
    "replay",
    "shuffle_trio",
    "summary",
]


def replay(
    workload: Workload,
    loaded: LoadedConfig,
    *,
    seed: int | None = None,
    store: Store | None = None,
    wall_limit: float | None = WALL_LIMIT,
) -> ReplayResult:
    """Replay ``workload`` under ``loaded``; the simulated trace and a summary.

    Everything runs inside a pyfakefs fake filesystem and under a
    ``MockClock``: nothing touches the disk, nothing spawns, nothing waits.
    ``seed`` reshuffles trio's wake-up order (the output must not change).
    ``store`` is the run ledger to replay into, empty and already open (a
    real SQLite or PostgreSQL ledger, to check that the supervisor decides
    the same on it; the ledger's own files or sockets are untouched by the
    fake filesystem); by default an in-memory one. Its calls run inline.

    A replay that stops making progress (a spin, a stall, or no end after
    ``wall_limit`` seconds of wall time; None: no wall limit) raises
    :class:`~herdsman.sim.bounds.Stuck` naming what stopped moving, when,
    and the last event delivered (herdsman.sim.bounds).
    """
    if seed is not None:
        shuffle_trio(seed)
    began = time.perf_counter()
    # Autojump only matters once the input is over (a shutdown's grace
    # period): while driving, the driver moves the clock itself. The watched
    # clock autojumps too, and finds a replay that stops making progress.
    driver = Driver(workload)
    if store is None:
        # Made here, so its ledger may apply each call through its apply_one.
        memory = MemoryStore()
        ledger: Store = memory
        commits = Inline(memory.apply_one)
    else:
        ledger, commits = store, inline
    with Patcher(), young_collections_rarer():
        result = run_watched(
            lambda clock: _replay(workload, loaded, clock, ledger, driver, commits=commits),
            progress=lambda: driver.moves,
            where=lambda: _where(driver, workload),
            wall_limit=wall_limit,
            grace=loaded.config.supervisor.shutdown_grace.total_seconds(),
        )
    return attrs.evolve(result, wall_seconds=time.perf_counter() - began)


def _where(driver: Driver, workload: Workload) -> str:
    """The last event the driver delivered, in a few words with its time."""
    if driver.last is None:
        return "before the first event, the supervisor starting"
    t, kind, order = driver.last
    if kind == ARRIVAL and order < len(workload.arrivals):
        arrival = workload.arrivals[order]
        run = arrival.fields.get("run", {}).get("id") or arrival.fields.get("run_id")
        what = f"the {arrival.kind}" + (f" of {run}" if run else "")
    else:
        run = next((r for r, plan in workload.plans.items() if plan.index == order), None)
        what = f"the end of {run}'s attempt" if run else "a run's end"
    what += f" at t={t:.3f}"
    if not driver.driving:
        return f"the input over, the supervisor stopping (the last event: {what})"
    return f"the last event delivered: {what}"


async def _replay(
    workload: Workload,
    given: LoadedConfig,
    clock: trio.testing.MockClock,
    store: Store,
    driver: Driver,
    *,
    commits: Inline,
) -> ReplayResult:
    # Made again inside the fake filesystem: a Path object made before the
    # patch began is the real pathlib's (docs/simulator.md) and can make the same
    # folder look like two.
    plain_instruments()
    loaded = config_from_trace(_config_json(given), "configuration")
    config = loaded.config
    git = FakeGit()
    for repo in config.repos:
        repo.path.mkdir(parents=True, exist_ok=True)
        git.init_repository(repo.path, {"README.md": "a simulated repository\n"})
    out = io.StringIO()

    # The clock itself rather than trio.current_time(), which reaches it
    # through two more calls, and without its real-clock arithmetic
    # (mock_time): the supervisor, the trace and the fake runner read the
    # time about ten times a run. The same clock, so the same times.
    now = driver.now = mock_time(clock)
    started_at = workload.started_at

    def wall() -> float:
        return started_at + now()

    trace = TraceWriter(
        Path("/herdsman-sim/traces"),
        max_bytes=1 << 62,
        sink=out,
        config=_config_json(loaded),
        clock=now,
        wall=lambda: dt.datetime.fromtimestamp(wall(), dt.UTC),
    )
    supervisor = Supervisor(
        config,
        store,
        execute=driver.execute,
        wall=wall,
        trace=trace,
        # Nothing scrapes a replay's /metrics: its runs are left uncounted.
        metrics=Uncounted(),
        run_sync=commits,
        git=git,
        loaded=loaded,
        stop_orphans=False,
        resolve_program=lambda name: name,
    )
    trace.open()
    _seed_lost(store, workload, config, wall())
    async with trio.open_nursery() as nursery:
        feed = _Feed(driver, supervisor, workload.arrivals, nursery)
        await nursery.start(supervisor.run)
        feed.push_next()
        driver.driving = True
        await drive(driver, supervisor, clock)
        driver.driving = False
        driver.moves += 1  # what holds the supervisor's stop is bounded from here
        span = trio.current_time()
        left_queued = supervisor.status()["queued"]
        # The input is over; what stopping the simulated supervisor traces is not.
        text = out.getvalue()
        supervisor.request_shutdown()
        await supervisor.finished.wait()
        nursery.cancel_scope.cancel()
    trace.close()
    return recording_ends(
        ReplayResult(
            text,
            feed.runs,
            span,
            0.0,
            tuple(driver.executions.defaulted),
            left_queued,
            workload.rotated_at,
        ),
        workload,
    )


def _seed_lost(store: Store, workload: Workload, config: Config, now: float) -> None:
    """Put the runs the recording found lost at its start in the ledger as running.

    The supervisor's recovery then finds them, as the recorded one did,
    and records them lost in the same order. The trace names only their
    ids: any configured provider stands for theirs (recovery reads no more).
    """
    if not workload.lost:
        return
    provider = next(iter(config.providers))
    for run_id in workload.lost:
        new = NewRun(id=run_id, provider=provider, prompt="(not recorded)", workspace="default")
        store.submit(new, now)
    store.mark_running_many([(run_id, None) for run_id in workload.lost], now)


class _Feed:
    """The trace's arrivals, handed to the supervisor one at a time through the driver.

    One arrival is in the driver's heap at a time: each, delivered, puts
    the next one in. One coroutine an arrival, the delivery itself.
    """

    def __init__(
        self,
        driver: Driver,
        supervisor: Supervisor,
        arrivals: Sequence[Arrival],
        nursery: trio.Nursery,
    ) -> None:
        self._driver = driver
        self._supervisor = supervisor
        self._arrivals = arrivals
        self._nursery = nursery
        self._next = 0  # the arrival in the heap, or past the last one
        #: Runs the arrivals submitted (created in the ledger, queued or skipped).
        self.runs = 0
        # Runs whose submit waits, as recorded, for a removal of their
        # conversation's worktrees: the removal the replay holds under way.
        self._held: dict[str, contextlib.ExitStack] = {}

    def push_next(self) -> None:
        """Put the next arrival in the driver's heap, if there is one."""
        order = self._next
        if order < len(self._arrivals):
            self._driver.push(self._arrivals[order].t, ARRIVAL, order, self._deliver)

    async def _deliver(self) -> None:
        arrival = self._arrivals[self._next]
        self._next += 1
        supervisor = self._supervisor
        if supervisor.finished.is_set():
            pass  # it has stopped (a replayed shutdown): nothing reaches it any more
        elif arrival.kind == "submit" and arrival.fields["run"]["id"] in self._held:
            # Recorded once the removal was over: it is over now, and the
            # submit made at the wait's beginning goes on and records it.
            self._held.pop(arrival.fields["run"]["id"]).close()
        elif arrival.kind in ("submit", "skip"):
            await self._submit(arrival.fields, arrival.kind)
        elif arrival.kind == "removal_wait":
            self._hold(arrival.fields)
        else:
            await deliver_arrival(supervisor, arrival)
        self.push_next()

    async def _submit(self, fields: Mapping[str, Any], kind: str) -> None:
        supervisor = self._supervisor
        new = new_run(fields["run"])
        if "account" in fields:  # running on it when the trace file was rotated
            supervisor.pin_account(new.id, fields["account"])
        try:
            # submit(new, on_busy) without its two wrapping coroutines.
            (result,) = await supervisor.submit_each([(new, "skip" if kind == "skip" else "queue")])
            _, created = result.unwrap()
        except NotAdmitting:  # after a replayed shutdown, as production refused it
            pass
        else:
            self.runs += created  # a repeated id is the run it already was

    def _hold(self, fields: Mapping[str, Any]) -> None:
        """A submit that waited for a sweep's removal: submitted now, held until recorded.

        The replay's own sweeps remove worktrees at once (its git takes no
        time), so none of its submits ever waits for one; the recording's
        did, and meanwhile its conversation (and agent) counted as busy to a
        submit that skips. The replay marks a removal of the conversation's
        worktrees under way until the run's recorded submit, and submits
        it now: the supervisor claims its keys and waits, as the recorded
        one did. A second wait on a conversation already held is not held
        again (one release would wake both, in trio's order): that run is
        submitted at its recorded submit, as without a wait
        (docs/simulator.md, "Worktree sweeps in a replay").
        """
        run = fields["run"]
        worktrees = self._supervisor.worktrees
        conversation, workspace = run.get("conversation"), run.get("workspace", "default")
        if (
            worktrees is None  # a what-if without repositories: nothing to wait for
            or conversation is None
            or worktrees.removal_under_way(workspace, conversation)
        ):
            return
        removal = contextlib.ExitStack()
        removal.enter_context(worktrees.removing(workspace, conversation))
        self._held[run["id"]] = removal
        self._nursery.start_soon(self._submit, {"run": run}, "submit")


def new_run(run: Mapping[str, Any]) -> NewRun:
    """A trace's run object as the ledger's new run (its prompt, if not traced, says so)."""
    return NewRun(
        id=run["id"],
        provider=run["provider"],
        prompt=run.get("prompt", "(not recorded)"),
        conversation=run.get("conversation"),
        agent=run.get("agent"),
        workspace=run.get("workspace", "default"),
        cwd=run.get("cwd"),
    )


async def deliver_arrival(supervisor: Supervisor, arrival: Arrival) -> None:
    """Hand an arrival other than a submit or skip to the supervisor."""
    fields = arrival.fields
    if arrival.kind == "cancel":
        # Already ended (or never submitted) in this replay: nothing to cancel.
        with contextlib.suppress(RunNotFound, RunConflict):
            await supervisor.cancel(fields["run_id"])
        return
    if arrival.kind == "shutdown":
        # As the signals did: the first drains (nothing new starts), a
        # forced one cancels what still runs.
        supervisor.request_shutdown()
        return
    if arrival.kind == "rest":  # resting when the trace file was rotated
        await supervisor.rest_account(
            fields["provider"], fields["account"], fields["until"], CARRIED_REST
        )
        return
    if arrival.kind == "rest_ended":
        with contextlib.suppress(UnknownAccount):  # a what-if without that account
            await supervisor.end_rest(fields["provider"], fields["account"])
        return
    if arrival.kind == "reload":
        loaded = config_from_trace(fields["config"], f"reload at t={arrival.t}")
        await supervisor.reload_to(loaded, "trace")
        return


def _config_json(loaded: LoadedConfig) -> dict[str, Any]:
    from herdsman.config.report import config_as_json  # noqa: PLC0415

    return config_as_json(loaded.config)
