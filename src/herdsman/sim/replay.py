"""Full-fidelity replay: the real supervisor on a fake clock, disk, store, git and runner.

Determinism by construction. One driver task owns every external event — an
arrival from the trace, the end of a fake run — in a heap keyed by ``(time,
kind, sequence)``, where the sequence comes from the trace (arrival order,
attempt number), never from which task woke first. The driver delivers one
event at a time and then waits until every task is blocked
(``trio.testing.wait_all_tasks_blocked``) before the next, so whatever one
event sets off has finished before the next begins; on reaching a time it
first lets the supervisor's own timers due then run out. Nothing is decided
by trio's wake-up order, which ``--seed`` reshuffles to prove it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import heapq
import io
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.config import LoadedConfig
from herdsman.runtime.git.fake import FakeGit
from herdsman.runtime.ledger import inline
from herdsman.runtime.runner import (
    Outcome,
    ProcessOutcome,
    ProcessSpec,
    RunCancel,
    UsageLimit,
)
from herdsman.runtime.store import MemoryStore, NewRun
from herdsman.runtime.supervisor import NotAdmitting, RunConflict, RunNotFound, Supervisor
from herdsman.sim.result import ReplayResult, summary
from herdsman.sim.workload import (
    DEFAULT_DURATION,
    Attempt,
    Executions,
    Workload,
    config_from_trace,
)
from herdsman.trace import TraceWriter

__all__ = ["DEFAULT_DURATION", "ReplayResult", "replay", "summary"]

# Event kinds in the order they go at one instant: a run ending frees its
# slot before an arrival at the same moment is looked at, as in a recording
# where the finish was written first.
_END, _ARRIVAL = 0, 1


class _Driver:
    """The heap of external events, and the fake runner that feeds it."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._heap: list[tuple[float, int, int, int, Callable[[], Awaitable[None]]]] = []
        self._pushes = 0
        self.executions = Executions(workload)
        self._pushed = trio.Event()

    def push(self, t: float, kind: int, order: int, action: Callable[[], Awaitable[None]]) -> None:
        # ``order`` breaks ties within a kind; the counter only keeps tuples
        # comparable (it never decides: equal (t, kind, order) cannot happen).
        self._pushes += 1
        heapq.heappush(self._heap, (t, kind, order, self._pushes, action))
        self._pushed.set()

    def next_time(self) -> float | None:
        """When the earliest event is due, if there is one."""
        return self._heap[0][0] if self._heap else None

    async def wait_until(self, t: float) -> None:
        """Until ``t``, or until an event is pushed (it may be due earlier)."""
        self._pushed = trio.Event()
        with trio.move_on_at(t):
            await self._pushed.wait()

    def pop(self) -> tuple[float, Callable[[], Awaitable[None]]] | None:
        if not self._heap:
            return None
        t, _, _, _, action = heapq.heappop(self._heap)
        return t, action

    async def execute(
        self,
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> ProcessOutcome:
        """The fake runner: ends when the driver says the recorded duration is up."""
        run_id = spec.env["HERDSMAN_RUN_ID"]
        plan = self.workload.plans.get(run_id)
        index = plan.index if plan is not None else len(self.workload.plans)
        attempt = self.executions.next(run_id)
        task_status.started(0)
        done = trio.Event()
        stopped: list[str] = []
        if cancel is not None:
            if cancel.cancelled:
                return _outcome(Attempt(0.0, "cancelled"), cancel.reason)

            def on_cancel(reason: str) -> None:
                stopped.append(reason)
                done.set()

            cancel._attach(on_cancel)

        async def end() -> None:
            done.set()

        self.push(trio.current_time() + attempt.duration, _END, index, end)
        try:
            await done.wait()
        finally:
            if cancel is not None:
                cancel._detach()
        if stopped:
            return _outcome(Attempt(0.0, "cancelled"), stopped[0])
        return _outcome(attempt, None)


def _outcome(attempt: Attempt, reason: str | None) -> ProcessOutcome:
    limit = None
    status = Outcome.SUCCEEDED
    if attempt.outcome == "usage_limited":
        status = Outcome.FAILED
        limit = UsageLimit(attempt.resets_at, "usage limit (recorded)")
    elif attempt.outcome != "succeeded":
        status = Outcome(attempt.outcome)
    if status is not Outcome.SUCCEEDED and reason is None:
        reason = f"{attempt.outcome} (recorded)"
    return ProcessOutcome(
        status=status,
        exit_code=attempt.exit_code,
        reason=reason,
        limit="timeout" if status is Outcome.TIMED_OUT else None,
        result="(simulated)" if status is Outcome.SUCCEEDED else None,
        session_id=None,
        excerpt="",
        usage_limit=limit,
    )


def replay(workload: Workload, loaded: LoadedConfig, *, seed: int | None = None) -> ReplayResult:
    """Replay ``workload`` under ``loaded``; the simulated trace and a summary.

    Everything runs inside a pyfakefs fake filesystem and under a
    ``MockClock``: nothing touches the disk, nothing spawns, nothing waits.
    ``seed`` reshuffles trio's wake-up order (the output must not change).
    """
    if seed is not None:
        _shuffle_trio(seed)
    began = time.perf_counter()
    with Patcher():
        result = trio.run(
            _replay, workload, loaded, clock=trio.testing.MockClock(autojump_threshold=0)
        )
    return attrs.evolve(result, wall_seconds=time.perf_counter() - began)


def _shuffle_trio(seed: int) -> None:
    # Private trio names (FINDINGS.md), guarded by tests/unit/platform's canary.
    import trio._core._run as trio_run  # noqa: PLC0415

    setattr(trio_run, "_ALLOW_DETERMINISTIC_SCHEDULING", True)  # noqa: B010 - a Final
    trio_run._r.seed(seed)


async def _replay(workload: Workload, given: LoadedConfig) -> ReplayResult:
    # Made again inside the fake filesystem: a Path object made before the
    # patch began is the real pathlib's (FINDINGS.md) and can make the same
    # folder look like two.
    loaded = config_from_trace(_config_json(given), "configuration")
    config = loaded.config
    driver = _Driver(workload)
    git = FakeGit()
    for repo in config.repos:
        repo.path.mkdir(parents=True, exist_ok=True)
        git.init_repository(repo.path, {"README.md": "a simulated repository\n"})
    out = io.StringIO()

    def wall() -> float:
        return workload.started_at + trio.current_time()

    trace = TraceWriter(
        Path("/herdsman-sim/traces"),
        max_bytes=1 << 62,
        sink=out,
        config=_config_json(loaded),
        clock=trio.current_time,
        wall=lambda: dt.datetime.fromtimestamp(wall(), dt.UTC),
    )
    supervisor = Supervisor(
        config,
        MemoryStore(),
        execute=driver.execute,
        wall=wall,
        trace=trace,
        run_sync=inline,
        git=git,
        loaded=loaded,
        stop_orphans=False,
        resolve_program=lambda name: name,
    )
    trace.open()
    runs = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        feed = iter(enumerate(workload.arrivals))

        def next_arrival() -> None:
            item = next(feed, None)
            if item is None:
                return
            order, arrival = item

            async def deliver() -> None:
                nonlocal runs
                runs += await _deliver(supervisor, arrival)
                next_arrival()  # one arrival in the heap at a time

            driver.push(arrival.t, _ARRIVAL, order, deliver)

        next_arrival()
        await _drive(driver, supervisor, wall)
        span = trio.current_time()
        left_queued = supervisor.status()["queued"]
        # The input is over; what stopping the simulated supervisor traces is not.
        text = out.getvalue()
        supervisor.request_shutdown()
        await supervisor.finished.wait()
        nursery.cancel_scope.cancel()
    trace.close()
    return ReplayResult(text, runs, span, 0.0, tuple(driver.executions.defaulted), left_queued)


async def _drive(driver: _Driver, supervisor: Supervisor, wall: Callable[[], float]) -> None:
    """Deliver every event in order, one at a time, until nothing more can happen."""
    while True:
        t = driver.next_time()
        if t is None:
            # Let the supervisor's timers due now act first (an account's
            # rest ending at this very moment starts runs), then decide.
            await trio.testing.wait_all_tasks_blocked()
            if driver.next_time() is not None:
                continue
            later = _next_account_wakeup(supervisor, wall())
            if later is None:
                return
            t = later
        if t > trio.current_time():
            # Wait for that moment, or for an earlier event: the supervisor's
            # own timers (an account's rest ending) can start runs
            # meanwhile, whose ends come before ``t``.
            await driver.wait_until(t)
            continue
        # The supervisor's own timers due by now go first, then the event.
        await trio.testing.wait_all_tasks_blocked()
        item = driver.pop()
        if item is None:
            continue
        _, action = item
        await action()
        await trio.testing.wait_all_tasks_blocked()


def _next_account_wakeup(supervisor: Supervisor, now_wall: float) -> float | None:
    """Trio time at which a resting account frees queued runs, if any wait for one."""
    untils: list[float] = [
        float(waiting["until"])
        for waiting in supervisor.waiting_for_accounts().values()
        if waiting["until"] is not None
    ]
    if not untils:
        return None
    return trio.current_time() + max(0.0, min(untils) - now_wall)


async def _deliver(supervisor: Supervisor, arrival: Any) -> int:
    """Hand one arrival to the supervisor; how many runs it submitted."""
    fields = arrival.fields
    if arrival.kind in ("submit", "skip"):
        run = fields["run"]
        new = NewRun(
            id=run["id"],
            provider=run["provider"],
            prompt=run.get("prompt", "(not recorded)"),
            conversation=run.get("conversation"),
            agent=run.get("agent"),
            workspace=run.get("workspace", "default"),
            cwd=run.get("cwd"),
        )
        try:
            _, created = await supervisor.submit(new, "skip" if arrival.kind == "skip" else "queue")
        except NotAdmitting:  # after a replayed shutdown, as production refused it
            return 0
        return 1 if created else 0  # a repeated id is the run it already was
    if arrival.kind == "cancel":
        # Already ended (or never submitted) in this replay: nothing to cancel.
        with contextlib.suppress(RunNotFound, RunConflict):
            await supervisor.cancel(fields["run_id"])
        return 0
    if arrival.kind == "shutdown":
        # As the signals did: the first drains (nothing new starts), a
        # forced one cancels what still runs.
        supervisor.request_shutdown()
        return 0
    if arrival.kind == "reload":
        loaded = config_from_trace(fields["config"], f"reload at t={arrival.t}")
        await supervisor.reload_to(loaded, "trace")
        return 0
    return 0


def _config_json(loaded: LoadedConfig) -> dict[str, Any]:
    from herdsman.config.report import config_as_json  # noqa: PLC0415

    return config_as_json(loaded.config)
