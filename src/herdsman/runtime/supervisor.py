"""The supervisor: intake, the scheduling loop and one task per running run.

Every state change goes through the *ledger lock*: the store write and the
matching scheduler call happen together, in the order the requests arrived,
so the store's submission order and the scheduler's never disagree. Store
calls run in a worker thread (SQLite commits fsync), never on the event loop.

At most once: a run is committed as running (``mark_running_many``, one
transaction for a burst of starts) before its process is spawned; a run found
running at start-up is recorded as lost, never re-run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

import attrs
import trio

from herdsman.config import Config
from herdsman.core import CancelOutcome, Limits, RunRequest, Scheduler
from herdsman.runtime.callbacks import deliver_callback
from herdsman.runtime.launch import build_spec
from herdsman.runtime.metrics import Metrics
from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec, RunCancel, execute
from herdsman.runtime.store import NewRun, RunRecord, RunStatus, Store
from herdsman.trace import TraceWriter

log = logging.getLogger("herdsman.supervisor")

OnBusy = Literal["queue", "skip"]


class Execute(Protocol):
    """The spawn port: the real runner, or the simulator's fake one."""

    def __call__(
        self,
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> Awaitable[ProcessOutcome]: ...


class NotAdmitting(Exception):
    """The supervisor is shutting down and takes no new runs."""


class RunNotFound(Exception):
    """No run has this id."""


class RunConflict(Exception):
    """The run is in a state that does not allow the request."""


@attrs.frozen
class ShutdownReport:
    """How the supervisor stopped."""

    drained: bool
    cancelled: tuple[str, ...]


def limits_of(config: Config) -> Limits:
    """The scheduler limits a config declares."""
    return Limits(
        {name: p.concurrency for name, p in config.providers.items()},
        config.supervisor.max_concurrency,
    )


def run_request(record: RunRecord | NewRun) -> RunRequest:
    """The scheduler's view of a run."""
    return RunRequest(
        record.id, record.provider, record.conversation, record.agent, record.workspace
    )


def trace_run(record: RunRecord | NewRun, *, with_prompt: bool) -> dict[str, Any]:
    """The ``run`` object of a submit or skip trace event."""
    out: dict[str, Any] = {"id": record.id, "provider": record.provider}
    if record.conversation is not None:
        out["conversation"] = record.conversation
    if record.agent is not None:
        out["agent"] = record.agent
    out["workspace"] = record.workspace
    if with_prompt:
        out["prompt"] = record.prompt
    return out


class Supervisor:
    """Owns the scheduler, the store and the tasks of running runs.

    ``run`` is the long-lived task; the intake methods (``submit``,
    ``cancel``, ``wait``, ``status``) are called by the API from the same
    trio run. ``wall`` gives unix seconds for the ledger (the simulator passes
    a fake); ``execute`` is the spawn port.
    """

    def __init__(
        self,
        config: Config,
        store: Store,
        *,
        execute: Execute = execute,
        wall: Callable[[], float] = time.time,
        trace: TraceWriter | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.generation = 1
        self.metrics = metrics or Metrics()
        self._store = store
        self._execute = execute
        self._wall = wall
        self._trace = trace
        self._scheduler = Scheduler(
            limits_of(config), agent_exclusive=config.scheduling.agent_exclusive
        )
        self._ledger = trio.Lock()
        self._wakeup = trio.Event()
        self._admitting = True
        self._drain_requested = trio.Event()
        self._force_requested = trio.Event()
        self._idle = trio.Event()
        self._handles: dict[str, RunCancel] = {}
        self._submitted_at: dict[str, float] = {}
        self._waiters: dict[str, trio.Event] = {}
        self._nursery: trio.Nursery | None = None
        self._callbacks: trio.Nursery | None = None
        self.lost_at_startup: tuple[str, ...] = ()
        self._recovered = False
        self.metrics.config_generation.set(self.generation)

    # -- lifecycle ---------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> ShutdownReport:
        """Schedule and execute runs until shut down (recovering first if not yet done)."""
        await self.recover()
        async with trio.open_nursery() as callbacks:
            self._callbacks = callbacks
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._dispatch_loop)
                nursery.start_soon(self._prune_loop)
                self._wake()
                task_status.started(self)
                report = await self._shutdown_when_asked()
                nursery.cancel_scope.cancel()
            # Callbacks of the last runs get a short grace, then are dropped.
            callbacks.cancel_scope.deadline = trio.current_time() + 10
        return report

    def request_shutdown(self) -> None:
        """First call: stop admitting and drain. Second call: cancel running runs."""
        if self._drain_requested.is_set():
            self._force_requested.set()
        else:
            self._drain_requested.set()

    @property
    def admitting(self) -> bool:
        """False once a shutdown was requested."""
        return self._admitting

    async def _shutdown_when_asked(self) -> ShutdownReport:
        await self._drain_requested.wait()
        self._admitting = False
        grace = self.config.supervisor.shutdown_grace.total_seconds()
        log.info(
            "shutting down: %d running run(s) may finish within %ss", len(self._handles), grace
        )
        drained = True
        with trio.move_on_after(grace):
            async with trio.open_nursery() as race:

                async def on_force() -> None:
                    await self._force_requested.wait()
                    race.cancel_scope.cancel()

                async def on_idle() -> None:
                    await self._wait_idle()
                    race.cancel_scope.cancel()

                race.start_soon(on_force)
                race.start_soon(on_idle)
        cancelled = tuple(self._handles)
        if cancelled:
            drained = False
            log.warning("cancelling %d running run(s)", len(cancelled))
            for handle in list(self._handles.values()):
                handle.cancel("supervisor shut down")
            await self._wait_idle()
        return ShutdownReport(drained=drained, cancelled=cancelled)

    async def _wait_idle(self) -> None:
        while self._handles:
            self._idle = trio.Event()
            await self._idle.wait()

    async def recover(self) -> None:
        """Record runs left running by a previous process as lost; re-queue the queued.

        Idempotent; ``run`` calls it if the caller did not.
        """
        if self._recovered:
            return
        self._recovered = True
        now = self._wall()
        lost = await trio.to_thread.run_sync(self._store.recover, now)
        self.lost_at_startup = tuple(r.id for r in lost)
        for record in lost:
            log.warning(
                "run %s was running when the supervisor stopped: recorded as lost", record.id
            )
            self._emit("lost", run_id=record.id)
            self.metrics.finished.labels(record.provider, RunStatus.LOST.value).inc()
        queued = await trio.to_thread.run_sync(self._store.queued_in_order)
        for record in queued:
            self._scheduler.submit(run_request(record))
            self._submitted_at[record.id] = record.submitted_at
        self._refresh_gauges()

    # -- intake ------------------------------------------------------------

    async def submit(self, new: NewRun, on_busy: OnBusy = "queue") -> tuple[RunRecord, bool]:
        """Record and queue a run; an existing id returns the existing run.

        With ``on_busy="skip"`` a run whose conversation or agent already has
        a queued or running run is recorded as skipped instead of queued.
        """
        if not self._admitting:
            raise NotAdmitting("the supervisor is shutting down and accepts no new runs")
        async with self._ledger:
            # Both store calls are idempotent: a known id returns its record.
            request = run_request(new)
            now = self._wall()
            if on_busy == "skip" and self._scheduler.is_busy(request):
                reason = "skipped: its conversation or agent already has a queued or running run"
                record, created = await trio.to_thread.run_sync(self._store.skip, new, now, reason)
                if created:
                    self._emit("skip", run=trace_run(new, with_prompt=self._trace_prompts))
                    self._notify(record.id)
                return record, created
            record, created = await trio.to_thread.run_sync(self._store.submit, new, now)
            if created:
                self._scheduler.submit(request)
                self._submitted_at[record.id] = record.submitted_at
                self._emit("submit", run=trace_run(new, with_prompt=self._trace_prompts))
                self.metrics.submitted.labels(new.provider).inc()
                self._refresh_gauges()
        self._wake()
        return record, created

    async def cancel(self, run_id: str, reason: str = "cancelled by request") -> RunRecord:
        """Cancel a queued run at once, or stop a running one (its task records it)."""
        async with self._ledger:
            outcome = self._scheduler.cancel(run_id)
            if outcome is CancelOutcome.REMOVED:
                now = self._wall()
                record = await trio.to_thread.run_sync(
                    self._store.cancel_queued, run_id, now, reason
                )
                self._submitted_at.pop(run_id, None)
                self._emit("cancel", run_id=run_id)
                self.metrics.finished.labels(record.provider, RunStatus.CANCELLED.value).inc()
                self._refresh_gauges()
                self._notify(run_id)
                self._wake()
                return record
            if outcome is CancelOutcome.RUNNING:
                self._handles[run_id].cancel(reason)
        record_or_none = await trio.to_thread.run_sync(self._store.get, run_id)
        if record_or_none is None:
            raise RunNotFound(run_id)
        if outcome is CancelOutcome.UNKNOWN:
            raise RunConflict(f"run {run_id} already ended as {record_or_none.status.value}")
        return record_or_none

    async def get(self, run_id: str) -> RunRecord | None:
        """The run's record, or ``None``."""
        return await trio.to_thread.run_sync(self._store.get, run_id)

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        """Runs matching the store's ``list_runs`` filters."""
        return await trio.to_thread.run_sync(lambda: self._store.list_runs(**filters))

    async def wait(self, run_id: str, timeout: float) -> RunRecord:
        """The run's record once it has ended, or as it stands after ``timeout``."""
        with trio.move_on_after(timeout):
            while True:
                record = await self.get(run_id)
                if record is None:
                    raise RunNotFound(run_id)
                if record.is_terminal:
                    return record
                event = self._waiters.setdefault(run_id, trio.Event())
                await event.wait()
        record = await self.get(run_id)
        if record is None:
            raise RunNotFound(run_id)
        return record

    def status(self) -> dict[str, Any]:
        """Limits, running and queued counts, and the oldest wait."""
        snap = self._scheduler.snapshot()
        oldest = next(self._scheduler.queued_runs(), None)
        age = self._wall() - self._submitted_at[oldest.id] if oldest is not None else None
        limits = self._scheduler.limits
        return {
            "admitting": self._admitting,
            "generation": self.generation,
            "limits": {"global": limits.global_cap, "providers": dict(limits.provider_caps)},
            "running": snap.running,
            "queued": snap.queued,
            "running_by_provider": dict(snap.running_by_provider),
            "queued_by_provider": dict(snap.queued_by_provider),
            "queued_by_lane": dict(snap.queued_by_lane),
            "oldest_queued_age": None if age is None else max(0.0, age),
            "lost_at_startup": len(self.lost_at_startup),
        }

    # -- scheduling and execution -----------------------------------------

    @property
    def _trace_prompts(self) -> bool:
        return self.config.trace.record_prompts

    def _wake(self) -> None:
        self._wakeup.set()

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._trace is not None:
            self._trace.event(kind, **fields)

    def _notify(self, run_id: str) -> None:
        event = self._waiters.pop(run_id, None)
        if event is not None:
            event.set()

    def _refresh_gauges(self) -> None:
        # O(providers): this runs on every event, so never take a snapshot here.
        scheduler = self._scheduler
        for provider in self.config.providers:
            self.metrics.queued.labels(provider).set(scheduler.queued_for(provider))
            self.metrics.running.labels(provider).set(scheduler.running_for(provider))

    async def _dispatch_loop(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            if self._admitting:
                await self._start_what_may_start()

    async def _start_what_may_start(self) -> None:
        async with self._ledger:
            starts = self._scheduler.take_startable()
            if not starts:
                return
            # Handles exist before the commit so a cancel arriving meanwhile
            # is not lost: RunCancel remembers a cancel made before execute.
            for run in starts:
                self._handles[run.id] = RunCancel()
            now = self._wall()
            records = await trio.to_thread.run_sync(
                self._store.mark_running_many, [(run.id, None) for run in starts], now
            )
        assert self._nursery is not None
        for record in records:
            self._emit("start", run_id=record.id, account=record.account)
            self.metrics.started.labels(record.provider).inc()
            wait = (record.started_at or now) - record.submitted_at
            self.metrics.queue_wait.labels(record.provider).observe(max(0.0, wait))
            self._submitted_at.pop(record.id, None)
            self._nursery.start_soon(self._execute_run, record, name=f"run {record.id}")
        self._refresh_gauges()

    async def _execute_run(self, record: RunRecord) -> None:
        handle = self._handles[record.id]
        outcome: ProcessOutcome | None = None
        try:
            spec = await self._spec_for(record)
            outcome = await self._execute(spec, cancel=handle)
        except OSError as exc:
            outcome = ProcessOutcome(
                status=Outcome.FAILED,
                exit_code=None,
                reason=f"could not start {record.provider}: {exc}",
                limit=None,
                result=None,
                session_id=None,
                excerpt="",
                usage_limit=None,
            )
        finally:
            # Shielded: a forced shutdown must still record how the run ended.
            with trio.CancelScope(shield=True):
                await self._record_finish(record, outcome)

    async def _spec_for(self, record: RunRecord) -> ProcessSpec:
        provider = self.config.providers.get(record.provider)
        if provider is None:
            raise OSError(f"provider {record.provider!r} is no longer configured")
        resume: list[str] = []
        if record.conversation is not None and provider.resume_args:
            session = await trio.to_thread.run_sync(
                self._store.conversation_session,
                record.provider,
                record.workspace,
                record.conversation,
            )
            if session is not None:
                resume = [arg.replace("{session}", session) for arg in provider.resume_args]
        spec = build_spec(record, self.config, resume=resume)
        await trio.to_thread.run_sync(lambda: spec.cwd.mkdir(parents=True, exist_ok=True))
        return spec

    async def _record_finish(self, record: RunRecord, outcome: ProcessOutcome | None) -> None:
        result: str | None = None
        session_id: str | None = None
        excerpt: str | None = None
        exit_code: int | None = None
        reason: str | None = "supervisor shut down"
        status = RunStatus.CANCELLED  # the task was cancelled before an outcome existed
        if outcome is not None:
            status = RunStatus(outcome.status.value)
            exit_code, reason = outcome.exit_code, outcome.reason
            result, session_id, excerpt = outcome.result, outcome.session_id, outcome.excerpt
        log_path = str(self.config.supervisor.state_dir / "logs" / f"{record.id}.log")
        async with self._ledger:
            now = self._wall()
            final = await trio.to_thread.run_sync(
                lambda: self._store.finish(
                    record.id,
                    status,
                    now,
                    exit_code=exit_code,
                    reason=reason,
                    result=result,
                    session_id=session_id,
                    excerpt=excerpt,
                    log_path=log_path,
                )
            )
            if session_id and record.conversation is not None:
                await trio.to_thread.run_sync(
                    self._store.set_conversation_session,
                    record.provider,
                    record.workspace,
                    record.conversation,
                    session_id,
                )
            self._scheduler.finish(record.id)
            del self._handles[record.id]
        self._emit("finish", run_id=record.id, outcome=status.value, exit_code=exit_code)
        self.metrics.finished.labels(record.provider, status.value).inc()
        if final.started_at is not None and final.finished_at is not None:
            duration = final.finished_at - final.started_at
            self.metrics.run_duration.labels(record.provider).observe(max(0.0, duration))
        self._refresh_gauges()
        self._notify(record.id)
        if not self._handles:
            self._idle.set()
        if final.callback_url and self._callbacks is not None:
            self._callbacks.start_soon(deliver_callback, final, name=f"callback {record.id}")
        self._wake()

    async def _prune_loop(self) -> None:
        keep = self.config.retention.finished_runs.total_seconds()
        while True:
            cutoff = self._wall() - keep
            pruned = await trio.to_thread.run_sync(self._store.prune, cutoff)
            if pruned:
                log.info("pruned %d finished run(s) older than %s", pruned, keep)
            await trio.sleep(min(3600.0, max(1.0, keep / 10)))
