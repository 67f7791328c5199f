"""The supervisor: intake, the scheduling loop and one task per running run.

Why this module is still long (about 1,770 lines): intake, the dispatch
loop, the run tasks with their finish, and the fleet member's glue share
the per-run state (handles, picks, submit times, waiters) on the path every
run takes, and are not yet split into the services the package is to hold;
the account tracker, reload, maintenance, a run's preparation, its recorded
outcome and the status views are modules of their own (docs/architecture.md).

Every store call goes through the :class:`~herdsman.runtime.ledger.Ledger`,
which applies calls in the order they were made and group-commits them. The
scheduler, the trace, the metrics and waiters are updated in the ledger's
``then`` callbacks, so they follow the ledger's order exactly. Not
everything: starts are taken by a separate dispatch task that the callbacks
wake, so when a start and another event are ready together, trio's wake-up
order decides which comes first. Harmless in production; the simulator stays
deterministic by delivering one event at a time and letting everything it
sets off settle before the next (sim/replay.py). Events that change what may
start (a reload, a shutdown) are traced in ledger order, after every start
decided before them.

At most once: a run is committed as running (``mark_running_many``, fsynced,
one transaction for a burst of starts) before its process is spawned; a run
found running at start-up is recorded as lost, never re-run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from operator import methodcaller
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import outcome
import trio

from herdsman.config import Config, LoadedConfig, format_duration
from herdsman.config.report import config_as_json
from herdsman.core import KeyClaims, RunRequest, RunState, busy_keys
from herdsman.core.accounts import Pick
from herdsman.core.lifecycle import Admission, Lifecycle, Withdrawal
from herdsman.core.outcome import RunOutcome, UsageLimit
from herdsman.core.runs import conversation_key
from herdsman.executables import resolve_executable
from herdsman.runtime import status_view
from herdsman.runtime.accounts import longest_window
from herdsman.runtime.callbacks import deliver_callback
from herdsman.runtime.changes import Changes
from herdsman.runtime.fleet_accounts import (
    read_fleet_accounts,
)
from herdsman.runtime.fleet_member import FleetMember, Refused
from herdsman.runtime.git import Git, RealGit
from herdsman.runtime.ledger import Ledger, Queued, RunSync, in_worker_thread
from herdsman.runtime.metrics import Metrics
from herdsman.runtime.orphan_watch import OrphanWatch
from herdsman.runtime.orphans import stop_orphans, stopped_note
from herdsman.runtime.reload import (
    Change,
    ConfigSource,
    ReloadResult,
)
from herdsman.runtime.requests import run_request, settings_of, trace_run, trace_run_text
from herdsman.runtime.runner import (
    Outcome,
    ProcessOutcome,
    ProcessSpec,
    RunCancel,
    execute,
    not_started,
)
from herdsman.runtime.runner.spawn_failure import why_not_spawned
from herdsman.runtime.stop_order import StopOrder
from herdsman.runtime.store import (
    NewRun,
    RunEnd,
    RunRecord,
    RunStatus,
    Store,
    StoreConflict,
    StoreError,
)
from herdsman.runtime.store.errors import CommitOutcomeUnknown, ConnectionLost
from herdsman.runtime.store.records import spend_json
from herdsman.runtime.supervisor.accounts import NO_HISTORY, AccountHistory, AccountTracker
from herdsman.runtime.supervisor.errors import (
    CancelNotRecorded,
    NotAdmitting,
    RunConflict,
    RunNotFound,
    ShutdownReport,
)
from herdsman.runtime.supervisor.maintenance import Maintenance
from herdsman.runtime.supervisor.outcomes import (
    SHUT_DOWN,
    account_signals,
    as_text,
    charged_once_recorded,
    finish_fields,
    refused_for_good,
    requeue_note,
)
from herdsman.runtime.supervisor.preparation import Preparation
from herdsman.runtime.supervisor.reloading import Reloader
from herdsman.runtime.worktrees.listing import describe_worktrees
from herdsman.runtime.worktrees.manager import WorktreeManager
from herdsman.runtime.worktrees.sweeper import SweepReport
from herdsman.trace import TraceWriter

if TYPE_CHECKING:
    from herdsman.runtime.store.fleet import ClaimResult, Poll

log = logging.getLogger("herdsman.supervisor")

OnBusy = Literal["queue", "skip"]
#: How long, after cancelling them, running runs may take to stop before their
#: tasks are cancelled outright (the runner's kill grace is 5 s).
FORCED_STOP_WAIT = 15.0
SKIP_REASON = "its conversation or agent already had a queued or running run"
#: What becomes of a run whose outcome the ledger could not record: alone, the
#: supervisor finds it running at its next start; a fleet member holds it
#: (and its lanes, fleet-wide) until its lease ends and an expiry sees that.
UNRECORDED = "the next start will report it lost"
UNRECORDED_IN_FLEET = (
    "it stays running in the ledger, its lanes held fleet-wide, until this member's"
    " lease ends; the expiry after that reports it lost"
)
RETRYING_IN_FLEET = "trying again until the ledger records it; its lanes stay held meanwhile"
#: The first wait before recording a finish again, then doubled up to the most.
FINISH_RETRY_FIRST = 0.5
FINISH_RETRY_MAX = 30.0
#: The longest the dispatcher waits before looking at resting accounts again.
ACCOUNT_RECHECK = 60.0
#: How long an orphaned agent gets between SIGTERM and SIGKILL at start-up.
ORPHAN_GRACE = 5.0


class Execute(Protocol):
    """The spawn port: the real runner, or the simulator's fake one."""

    def __call__(
        self,
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> Awaitable[ProcessOutcome]: ...


class _QueuedStarts:
    """Starts queued in the ledger and not yet known to be committed.

    A plain class: one is made for nearly every run, and a frozen attrs
    class stores each field through a call of ``object.__setattr__``.
    """

    __slots__ = ("now", "pending", "runs")

    def __init__(self, runs: list[str], now: float, pending: Queued[Any]) -> None:
        self.runs = runs
        self.now = now
        self.pending = pending


@attrs.frozen
class _Withdrawn:
    """A queued (or parked) run a cancel took out of the lifecycle: what puts it back."""

    request: RunRequest
    seq: int
    submitted_at: float | None
    #: It started before (a usage limit re-queued it): one never re-queues it again.
    again: bool


def _conversation_keys(records: list[RunRecord]) -> list[str]:
    """One key per record in a conversation: each is claimed, and released, once."""
    return [
        conversation_key(record.workspace, record.conversation)
        for record in records
        if record.conversation is not None
    ]


class Supervisor:
    """Drives the run lifecycle; owns the ledger and the tasks of running runs.

    ``run`` is the long-lived task; the intake methods (``submit``,
    ``cancel``, ``get``, ``wait``, ``status``) are called by the API from the
    same trio run. ``wall`` gives unix seconds for the ledger (the simulator
    passes a fake); ``execute`` is the spawn port; ``run_sync`` is how store
    batches run (a worker thread for SQLite, inline for the in-memory store).
    With a ``source`` (and the ``loaded`` configuration it gave), the file is
    watched and :meth:`reload` reads it again. ``stop_orphans``: stop agents
    of lost runs that outlived the previous process — at start-up, or, for a
    fleet member, once the ledger ends their runs (the simulator, which
    spawns nothing, turns it off); ``resolve_program`` finds
    a provider's program on PATH (the simulator's finds every name).
    """

    #: Once a forced stop cancelled the running runs: the order they record in.
    _stop_order: StopOrder | None = None

    def __init__(
        self,
        config: Config,
        store: Store,
        *,
        execute: Execute = execute,
        wall: Callable[[], float] = time.time,
        trace: TraceWriter | None = None,
        metrics: Metrics | None = None,
        run_sync: RunSync = in_worker_thread,
        git: Git | None = None,
        source: ConfigSource | None = None,
        loaded: LoadedConfig | None = None,
        stop_orphans: bool = True,
        resolve_program: Callable[[str], str | None] = resolve_executable,
        fleet: FleetMember | None = None,
    ) -> None:
        self.config = config
        self._stop_orphans = stop_orphans
        self._fleet = fleet
        # A member stops the agents its previous process left once their
        # runs' lease expiry is seen (a sole supervisor does so in _recover).
        self._orphans = (
            OrphanWatch(
                config.supervisor.state_dir, agent_exclusive=config.scheduling.agent_exclusive
            )
            if fleet is not None and stop_orphans
            else None
        )
        self.metrics = metrics or Metrics()
        # Run counts that count nothing (the replay's) are not even called.
        self._counts_runs = self.metrics.counts_runs
        self.ledger = Ledger(store, run_sync=run_sync)
        self._execute = execute
        self._wall = wall
        self._trace = trace
        # Every rule of a run's life: this supervisor hands it the events.
        self._life = Lifecycle(settings_of(config))
        # How runs end, one value per distinct ending (RunOutcome holds nothing of a run).
        self._outcomes: dict[tuple[Outcome, int | None, bool], RunOutcome] = {}
        # The account each starting run was given, and the configuration its
        # start was decided under, until its task has read them.
        self._picks: dict[str, tuple[Pick, Config]] = {}
        self._wakeup = trio.Event()
        #: Touched whenever what the dashboard shows may have changed.
        self.changes = Changes()
        #: When (trio time) the dispatcher looks again at runs waiting for a
        #: resting account, if any wait: the simulator advances time to it.
        self.account_recheck_at: float | None = None
        self._drain_requested = trio.Event()
        self._force_requested = trio.Event()
        self._idle = trio.Event()
        self._handles: dict[str, RunCancel] = {}
        # Runs whose checkouts are being prepared (nothing spawned yet).
        self._preparing: dict[str, trio.CancelScope] = {}
        # Fleet members' finishes the ledger refused, being recorded again.
        self._finish_retries: dict[str, trio.CancelScope] = {}
        self._fatal: str | None = None
        self._git = git
        self._worktrees: WorktreeManager | None = None
        if config.repos:
            self._worktrees = self._worktree_manager(config)
        self._prep = Preparation(
            self.ledger,
            worktrees=lambda: self._worktrees,
            orphans=self._orphans,
            resolve_program=resolve_program,
        )
        self._submitted_at: dict[str, float] = {}
        # Keys of submits queued in the ledger but not yet in the scheduler,
        # so on_busy="skip" sees a follow-up that arrived a moment earlier.
        self._pending_keys = KeyClaims()
        self._waiters: dict[str, list[trio.Event]] = {}
        self._ready = trio.Event()  # recovery done: intake may proceed
        self._stopping = False
        self._nursery: trio.Nursery | None = None
        self._callbacks: trio.Nursery | None = None
        self.lost_at_startup: tuple[str, ...] = ()
        self.finished = trio.Event()
        self.report: ShutdownReport | None = None
        self._reloader = Reloader(
            source,
            loaded,
            wall=wall,
            metrics=self.metrics,
            apply=self._apply,
            emit=self._emit,
            emit_in_ledger_order=self._emit_in_ledger_order,
            changes=self.changes,
        )
        self._tracker = AccountTracker(
            self._life, self.ledger, wall=wall, fleet=fleet, emit=self._emit, wake=self._wake
        )
        self._maintenance = Maintenance(
            self.ledger,
            config=lambda: self.config,
            worktrees=lambda: self._worktrees,
            wall=wall,
            is_busy=self.conversation_busy,
            fleet=fleet,
            sleep_until=self._reloader.sleep_until,
        )
        self.metrics.watch_queue(self._queue_counts)

    @property
    def generation(self) -> int:
        """The configuration's generation: 1 at the start, one more each applied reload."""
        return self._reloader.generation

    @property
    def last_reload(self) -> ReloadResult | None:
        """What the last reload did, if there was one."""
        return self._reloader.last_reload

    @property
    def waiting_for_restart(self) -> tuple[Change, ...]:
        """Settings changed in the file that apply only at the next start (last applied reload)."""
        return self._reloader.waiting_for_restart

    # -- lifecycle ---------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> ShutdownReport:
        """Recover, then schedule and execute runs until shut down.

        ``task_status.started`` is called once recovery is done: from then on
        the intake methods may be used.
        """
        # The writer is shielded so that, even when the whole supervisor is
        # cancelled from outside, the runs being stopped can still record how
        # they ended; it is cancelled explicitly once nothing else records.
        writer_scope = trio.CancelScope(shield=True)

        async def writer() -> None:
            with writer_scope:
                await self.ledger.run()

        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(writer)
                try:
                    report = await self._serve(task_status)
                finally:
                    writer_scope.cancel()
        finally:
            self.finished.set()
        self.report = report
        return report

    async def _serve(self, task_status: trio.TaskStatus[Supervisor]) -> ShutdownReport:
        await self._recover()
        async with trio.open_nursery() as callbacks:
            self._callbacks = callbacks
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._dispatch_loop)
                nursery.start_soon(self._maintenance.prune_loop)
                nursery.start_soon(self._maintenance.sweep_loop)
                if self._fleet is not None:
                    nursery.start_soon(self._fleet_lease_loop)
                    nursery.start_soon(self._fleet.poll_loop, self._poll_interval, self._fleet_poll)
                    if self._orphans is not None and self._orphans.watched:
                        nursery.start_soon(self._watch_orphans)
                if self._reloader.watches:
                    nursery.start_soon(self._reloader.watch)
                self._wake()
                self._ready.set()
                task_status.started(self)
                report = await self._shutdown_when_asked()
                # Long polls answer with the record as it stands, now, rather
                # than hold the API's shutdown until they time out.
                self._stopping = True
                for run_id in list(self._waiters):
                    self._notify(run_id)
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
        return self._life.admitting

    async def _shutdown_when_asked(self) -> ShutdownReport:
        await self._drain_requested.wait()
        self._life.drain()
        # In the trace, after every start decided before it: a replay then
        # stops starting runs exactly where production did.
        await self._emit_in_ledger_order("shutdown")
        grace = self.config.supervisor.shutdown_grace
        if self._handles:
            log.info(
                "shutting down: %d running run(s) may finish within %s",
                len(self._handles),
                format_duration(grace),
            )
        grace_seconds = grace.total_seconds()
        with trio.move_on_after(grace_seconds):
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
            await self._emit_in_ledger_order("shutdown", forced=True)
            # Those still running once the event is out (a run may have ended
            # while it was written); their ends are recorded in submission
            # order, not in the order their processes exit (stop_order.py).
            cancelled = tuple(self._handles)
            log.warning("cancelling %d running run(s)", len(cancelled))
            self._stop_order = StopOrder(cancelled, trio.current_time() + FORCED_STOP_WAIT)
            for run_id in cancelled:
                self._stop(run_id, "supervisor shut down")
            # A finish the ledger keeps refusing is given up on: the lease
            # expiry after this member has gone reports the run lost.
            for retrying in self._finish_retries.values():
                retrying.cancel()
            # Process groups get SIGTERM, then SIGKILL after the kill grace;
            # anything still not done after that is cancelled outright (its
            # task still records it, shielded).
            with trio.move_on_after(FORCED_STOP_WAIT):
                await self._wait_idle()
            if self._handles:
                log.error("%d run(s) did not stop; cancelling their tasks", len(self._handles))
                assert self._nursery is not None
                self._nursery.cancel_scope.cancel()
                # Shielded: this runs inside that nursery, whose cancel would
                # end the wait at once (and leave no report to return).
                with trio.CancelScope(shield=True):
                    await self._wait_idle()
        return ShutdownReport(drained=not cancelled, cancelled=cancelled, fatal=self._fatal)

    def _stop(self, run_id: str, reason: str) -> None:
        """Stop a running run: its process group, or its preparation if not spawned yet."""
        # Running in the lifecycle (a run has a handle from its start until its
        # task lets it go), or ended already there (its finish on its way).
        self._life.cancel(run_id)
        self._handles[run_id].cancel(reason)
        preparing = self._preparing.get(run_id)
        if preparing is not None:
            preparing.cancel()

    async def _wait_idle(self) -> None:
        while self._handles:
            self._idle = trio.Event()
            await self._idle.wait()

    async def _recover(self) -> None:
        now = self._wall()
        if self._fleet is not None:
            # A member recovers nothing: other members may be running the
            # runs it finds running; a dead member's runs are lost by expiry.
            if self._orphans is not None:
                await self._orphans.find(self.ledger)
                await self._stop_ended_orphans()
            await self._fleet_poll()
            await self._tracker.recover(now, self.config)
            return
        lost = await self.ledger.call(lambda s: s.recover(now))
        self.lost_at_startup = tuple(r.id for r in lost)
        for record in lost:
            log.warning(
                "run %s was running when the supervisor stopped: recorded as lost", record.id
            )
            self._emit("lost", run_id=record.id)
            if self._counts_runs:
                self.metrics.count_finish(record.provider, RunStatus.LOST.value)
        if lost and self._stop_orphans:
            await self._stop_orphaned_agents(self.lost_at_startup)
        for record in await self.ledger.call(lambda s: s.queued_in_order()):
            self._life.submit(run_request(record), now, attempts=record.attempts)
            self._submitted_at[record.id] = record.submitted_at
            # This trace file starts here: it restates what is queued, so it
            # can be replayed on its own.
            self._emit(
                "submit", run=trace_run(record, with_prompt=self._trace_prompts), carried=True
            )
        await self._tracker.recover(now, self.config)

    async def _stop_orphaned_agents(self, run_ids: tuple[str, ...]) -> None:
        """Stop agents of lost runs still running, before anything new starts.

        Left alone, one would keep working in its conversation's worktree
        while the conversation's next run starts there.
        """
        state_dir = self.config.supervisor.state_dir
        orphans = await stop_orphans(run_ids, state_dir, ORPHAN_GRACE)
        await self._note_stopped(orphans)

    async def _note_stopped(self, orphans: dict[str, set[int]]) -> None:
        """Say on each run that its agent outlived the previous process and was stopped."""
        for run_id, groups in sorted(orphans.items()):
            await self.ledger.call(methodcaller("add_note", run_id, stopped_note(groups)))

    # -- intake ------------------------------------------------------------

    async def submit(self, new: NewRun, on_busy: OnBusy = "queue") -> tuple[RunRecord, bool]:
        """Record and queue a run; an existing id returns the existing run.

        With ``on_busy="skip"`` a run whose conversation or agent already has
        a queued or running run (fleet-wide, for a fleet member) is recorded
        as skipped instead of queued.
        """
        # submit_many's answer, without its list and unwrap (three Python
        # calls): one submit a run. The simulator's replay (sim/replay.py's
        # _Feed) does the same without this coroutine: change both together.
        (result,) = await self.submit_each([(new, on_busy)])
        if isinstance(result, outcome.Value):
            value: tuple[RunRecord, bool] = result.value
            return value
        assert isinstance(result, outcome.Error)
        raise result.error

    async def submit_many(
        self, items: Sequence[tuple[NewRun, OnBusy]]
    ) -> list[tuple[RunRecord, bool]]:
        """Submit several runs in the given order, in one ledger operation.

        Raises the error of the first item the ledger refused (the others
        are recorded all the same): :meth:`submit_each` answers each item.
        """
        return [result.unwrap() for result in await self.submit_each(items)]

    async def submit_each(
        self, items: Sequence[tuple[NewRun, OnBusy]]
    ) -> list[outcome.Outcome[tuple[RunRecord, bool]]]:
        """As :meth:`submit_many`, with each item's own result or error.

        An item the ledger refuses is undone alone, and the others are
        recorded: each gets its answer. A commit that fails as a whole
        raises, as for a single submit.
        """
        if not self._ready.is_set():  # waiting on a set Event would still yield once
            await self._ready.wait()
        if not self._life.admitting:
            raise NotAdmitting("the supervisor is shutting down and accepts no new runs")
        plan: list[tuple[NewRun, RunRequest, bool]] = []
        claimed: list[str] = []
        life, pending_keys = self._life, self._pending_keys
        agent_exclusive = life.settings.agent_exclusive
        for new, on_busy in items:
            request = run_request(new)
            keys = busy_keys(request, agent_exclusive=agent_exclusive)
            # Submits still in the ledger count as busy too, so a follow-up
            # arriving a moment after its predecessor is still skipped.
            # (Whether it is busy matters only to a submit that skips then.)
            skip = on_busy == "skip" and (
                life.is_busy(request) or any(map(pending_keys.claimed, keys))
            )
            if keys and not skip:  # a run without a conversation or agent has none
                pending_keys.claim(keys)
                claimed.extend(keys)
            plan.append((new, request, skip))
        try:
            if self._worktrees is not None:
                # Claimed above, so no sweep starts removing these
                # conversations' worktrees now; one removal may already be
                # under way: the run is recorded once it has finished.
                for new, _, skip in plan:
                    if not skip and new.conversation is not None:
                        if self._worktrees.removal_under_way(new.workspace, new.conversation):
                            # What a replay needs to hold it as long (docs/simulator.md).
                            self._emit("removal_wait", run_id=new.id)
                        await self._worktrees.removal_finished(new.workspace, new.conversation)
            now = self._wall()
            return await self._record_submits(plan, now, [on_busy for _, on_busy in items])
        finally:
            if claimed:
                pending_keys.release(claimed)

    async def _record_submits(
        self, plan: list[tuple[NewRun, RunRequest, bool]], now: float, on_busy: list[OnBusy]
    ) -> list[outcome.Outcome[tuple[RunRecord, bool]]]:
        # A sole supervisor records each submit as it is (no Python-level
        # wrapper a run); a fleet member's may be decided in the ledger.
        submit = None if self._fleet is None else self._submit_operation(now)
        # No checkpoint between here, the callback and the starts below.
        # A ledger that applies each call at once has no commits to batch
        # starts behind: a submit takes its starts itself.
        takes_starts = self.ledger.applies_at_once and self._fleet is None and self._life.admitting
        trace_prompts = self.config.trace.record_prompts

        def operation(store: Store) -> list[outcome.Outcome[tuple[RunRecord, bool]]]:
            return [
                outcome.capture(store.skip, new, now, SKIP_REASON)
                if skip
                else outcome.capture(store.submit, new, now)
                if submit is None
                else outcome.capture(submit, store, new, busy)
                for (new, _, skip), busy in zip(plan, on_busy, strict=True)
            ]

        def recorded(results: list[outcome.Outcome[tuple[RunRecord, bool]]]) -> None:
            for (new, request, _), result in zip(plan, results, strict=True):
                if not isinstance(result, outcome.Value):
                    continue
                record, created = result.value
                if not created:
                    continue
                if record.status is RunStatus.SKIPPED:
                    self._emit("skip", run=trace_run(new, with_prompt=trace_prompts))
                    self._notify(record.id)
                    continue
                if self._fleet is not None:
                    # A member queues every run from the ledger, in the
                    # fleet's order: its own runs too, at the poll this wakes.
                    self._fleet.poke()
                else:
                    if self._life.submit(request, now) is Admission.REFUSED:
                        # Recorded queued as a drain began: it waits here as in the ledger.
                        self._life.adopt(request)
                    self._submitted_at[record.id] = record.submitted_at
                    if self._trace is not None:  # _emit's, its run object composed as text
                        self._trace.submit(new.id, trace_run_text(new, with_prompt=trace_prompts))
                if self._counts_runs:
                    self.metrics.count_submit(new.provider)
            if not takes_starts:
                self._wake()

        try:
            # Ledger.call in its two steps: a call the ledger applied at once
            # (the inline ledger's, always) has its value already, and no
            # coroutine is made to return it.
            pending = self.ledger.enqueue(operation, then=recorded)
            results: list[outcome.Outcome[tuple[RunRecord, bool]]]
            if pending.committed and pending.error is None:
                results = pending.value  # type: ignore[assignment]  # committed: its value
            else:
                results = await self.ledger.result(pending)
        except CommitOutcomeUnknown as exc:
            if self._fleet is not None:
                raise  # a member's poll queues whatever the ledger kept
            await self._adopt_kept_submits(plan, exc, recorded)
            raise
        if takes_starts:
            starts = self._take_starts()
            # Committed already, with nothing to wait for or handle: as
            # always on the inline ledger, no coroutine for it.
            if starts is not None and not (
                starts.pending.committed and starts.pending.error is None
            ):
                await self._commit_starts(starts)
        return results

    async def _adopt_kept_submits(
        self,
        plan: list[tuple[NewRun, RunRequest, bool]],
        exc: CommitOutcomeUnknown,
        recorded: Callable[[list[outcome.Outcome[tuple[RunRecord, bool]]]], None],
    ) -> None:
        """Submits whose COMMIT answer was lost: queue here those the ledger kept.

        A kept run must be queued here too: a submit of it again (as the
        answer says) finds it in the ledger and returns it as known, so
        nothing else would ever start it. A queued run the scheduler does
        not know can only be one of these (read in ledger order, in the
        read's callback). The caller still gets the lost answer's error.
        """
        ids = [new.id for new, _, _ in plan]
        kept: list[outcome.Outcome[tuple[RunRecord, bool]]] = []

        def adopt(records: list[RunRecord | None]) -> None:
            for record in records:
                if record is None:
                    kept.append(outcome.Error(exc))
                    continue
                new = (
                    record.status is RunStatus.QUEUED
                    and self._life.scheduler.state_of(record.id) is None
                )
                kept.append(outcome.Value((record, new)))
            recorded(kept)

        try:
            # Through the ledger: on the connection made again.
            await self.ledger.call(lambda s: [s.get(run_id) for run_id in ids], then=adopt)
        except StoreError as read_exc:
            # Kept or not, unknown still: a restart queues a kept run.
            log.warning("could not read back submits whose commit's answer was lost: %s", read_exc)

    def _submit_operation(
        self, now: float
    ) -> Callable[[Store, NewRun, OnBusy], tuple[RunRecord, bool]]:
        """How a fleet member records a submit its local view does not skip.

        A fleet member's view misses runs queued or running on other members
        and not yet polled: there the ledger decides ``on_busy = "skip"``,
        fleet-wide, in the transaction that records the run. (A sole
        supervisor records a submit with ``store.submit`` itself.)
        """
        fleet, agent_exclusive = self._fleet, self._life.settings.agent_exclusive
        assert fleet is not None

        def submit(store: Store, new: NewRun, on_busy: OnBusy) -> tuple[RunRecord, bool]:
            if on_busy != "skip":
                return store.submit(new, now)
            return fleet.store.submit_unless_busy(
                new, now, SKIP_REASON, agent_exclusive=agent_exclusive
            )

        return submit

    async def cancel(self, run_id: str, reason: str = "cancel requested") -> RunRecord:
        """Cancel a queued run at once, or stop a running one (its task records it).

        A ledger that fails to record the cancel of a queued run raises
        :class:`CancelNotRecorded` and leaves the run queued, in the scheduler
        as in the ledger. One whose COMMIT answer was lost is read back: a
        kept cancel is returned as recorded (see :meth:`_cancel_outcome`).
        """
        await self._ready.wait()
        # Decided the moment the request arrives when the scheduler knows the
        # run; only an id it does not know waits for the ledger (a submit of
        # it may still be in flight, and the ledger is FIFO).
        withdrawn, back = self._withdraw(run_id)  # a parked (held) run: REMOVED
        try:
            return await self._cancel_recorded(run_id, reason, withdrawn, back)
        except StoreConflict:
            if self._fleet is None:
                raise
            # Withdrawn here (at once, or after a claim of it came back) but
            # not queued in the ledger: claimed by another member since this
            # one polled it, or ended. The ledger is the truth, and asks its
            # holder to cancel it; a race is never the user's error.
            return await self._cancel_elsewhere(run_id, reason)

    def _withdraw(self, run_id: str) -> tuple[Withdrawal, _Withdrawn | None]:
        """Cancel the run in the lifecycle; with what puts it back, if it was withdrawn."""
        life = self._life
        request, seq = life.scheduler.request_of(run_id), life.scheduler.seq_of(run_id)
        again = life.started_before(run_id)
        submitted_at = self._submitted_at.pop(run_id, None)
        withdrawn = life.cancel(run_id)
        if withdrawn is not Withdrawal.WITHDRAWN or request is None or seq is None:
            return withdrawn, None
        return withdrawn, _Withdrawn(request, seq, submitted_at, again)

    def _put_back(self, back: _Withdrawn | None) -> None:
        """The ledger refused a cancel: the run is still queued there, so it is here again."""
        # In its place by its seq (the scheduler's, or a member's from the
        # ledger), ahead of the runs that came after it: a conversation's
        # runs start in arrival order, a refused cancel or not.
        if back is None or not self._life.adopt(
            back.request, seq=back.seq, attempts=int(back.again)
        ):
            return
        if back.submitted_at is not None:
            self._submitted_at[back.request.id] = back.submitted_at
        self._wake()

    async def _cancel_recorded(
        self, run_id: str, reason: str, withdrawn: Withdrawal, back: _Withdrawn | None
    ) -> RunRecord:
        if withdrawn is Withdrawal.WITHDRAWN:
            # Recorded with nothing awaited since the withdrawal: a start
            # it frees (the next run on its lanes) is then committed, and
            # traced, after the cancel, never before it.
            return await self._record_cancel(run_id, reason, back)
        record = await self.get(run_id)
        if record is None:
            raise RunNotFound(run_id)
        if withdrawn is Withdrawal.UNKNOWN and self._life.scheduler.state_of(run_id) is not None:
            # Its submit was still in flight a moment ago.
            withdrawn, back = self._withdraw(run_id)
        if withdrawn is Withdrawal.STOP:
            # The run may have ended, or gone back to the queue (a usage
            # limit), or been parked (a claim refused), while its record was read.
            state = self._life.scheduler.state_of(run_id)
            if state is RunState.QUEUED or state is RunState.HELD:
                withdrawn, back = self._withdraw(run_id)
            elif run_id in self._handles:
                self._stop(run_id, reason)
                return record
            else:
                now_record = await self.get(run_id)
                if (
                    self._fleet is not None
                    and now_record is not None
                    and not now_record.is_terminal
                ):
                    # Its claim here found it gone: another member claimed
                    # it (or it was queued again). Ask the ledger there.
                    return await self._cancel_elsewhere(run_id, reason)
                ended = now_record.status.value if now_record is not None else "unknown"
                raise RunConflict(f"run {run_id} already ended as {ended}")
        if withdrawn is Withdrawal.UNKNOWN:
            if self._fleet is not None and not record.is_terminal:
                # Held by another member, or queued and not polled here yet.
                return await self._cancel_elsewhere(run_id, reason)
            raise RunConflict(f"run {run_id} already ended as {record.status.value}")
        return await self._record_cancel(run_id, reason, back)

    async def _cancel_elsewhere(self, run_id: str, reason: str) -> RunRecord:
        """Cancel a run this member's scheduler does not hold, through the ledger.

        A running run's holder is asked to cancel it (it stops the process at
        its next poll and records the run cancelled); the record returned is
        then still running. A queued one is cancelled at once.
        """
        assert self._fleet is not None
        store, now = self._fleet.store, self._wall()

        def asked(result: tuple[RunRecord, bool]) -> None:
            record, cancelled = result
            if cancelled:
                if self._counts_runs:
                    self.metrics.count_finish(record.provider, RunStatus.CANCELLED.value)
                self._notify(run_id)

        record, cancelled = await self.ledger.call(
            lambda _: store.request_cancel(run_id, now, reason), then=asked
        )
        if record.is_terminal and not cancelled:
            raise RunConflict(f"run {run_id} already ended as {record.status.value}")
        if record.status is RunStatus.RUNNING:
            log.info("run %s runs on another member: asked it to cancel the run", run_id)
        return record

    async def _record_cancel(self, run_id: str, reason: str, back: _Withdrawn | None) -> RunRecord:
        """Record the cancel of a run just withdrawn from the queue (``back`` undoes that)."""
        now = self._wall()

        def cancelled(final: RunRecord) -> None:
            self._emit("cancel", run_id=run_id)
            if self._counts_runs:
                self.metrics.count_finish(final.provider, RunStatus.CANCELLED.value)
            self._notify(run_id)
            self._wake()

        try:
            pending = self.ledger.enqueue(
                lambda s: s.cancel_queued(run_id, now, reason), then=cancelled
            )
            # Shielded: the cancel is recorded or refused whether or not its
            # caller still waits (a client that hung up), and only a waiter
            # learns a refusal and puts the run back. A batch's commit is
            # waited for shielded by the ledger's writer anyway.
            with trio.CancelScope(shield=True):
                record = await self.ledger.result(pending)
        except StoreConflict:
            raise  # the ledger no longer has it queued: nothing to put back
        except CommitOutcomeUnknown as exc:
            return await self._cancel_outcome(run_id, back, exc, cancelled)
        except StoreError as exc:
            raise self._still_queued(run_id, back, exc) from exc
        except Exception:
            # No store failure (a bug, an error the store did not map): the
            # caller gets it as it is (a 500), but the operation was undone,
            # so the run is still queued in the ledger and must be here too,
            # in its place, or nothing would start it until a restart.
            self._put_back(back)
            raise
        return record

    async def _cancel_outcome(
        self,
        run_id: str,
        back: _Withdrawn | None,
        exc: CommitOutcomeUnknown,
        cancelled: Callable[[RunRecord], None],
    ) -> RunRecord:
        """A cancel whose COMMIT answer was lost: the ledger says whether it was kept.

        Put back only a run the ledger still has queued: a start of one it
        cancelled would be refused, and a refused start stops the supervisor.
        """

        def kept(record: RunRecord | None) -> None:
            # In ledger order, as the cancel's own callback would have run.
            if record is not None and record.status is RunStatus.CANCELLED:
                cancelled(record)

        try:
            # Through the ledger: after the commit, on the connection made again.
            record = await self.ledger.call(lambda s: s.get(run_id), then=kept)
        except StoreError as read_exc:
            # Not put back: a run that may be cancelled is never started.
            message = (
                f"the cancel of run {run_id} may have been recorded ({exc}), and reading the"
                f" run back failed too ({read_exc}); it is not started by this supervisor"
                " (a restart queues it again if the cancel was not kept)"
            )
            log.warning("%s", message)
            raise CancelNotRecorded(message) from exc
        if record is not None and record.status is RunStatus.QUEUED:
            raise self._still_queued(run_id, back, exc) from exc
        if record is None or record.status is not RunStatus.CANCELLED:
            ended = "unknown" if record is None else record.status.value
            raise RunConflict(f"run {run_id} already ended as {ended}") from exc
        log.info("the cancel of run %s was recorded, though its commit's answer was lost", run_id)
        return record

    def _still_queued(
        self, run_id: str, back: _Withdrawn | None, exc: StoreError
    ) -> CancelNotRecorded:
        """A cancel the ledger did not record: the run goes back in its place; the error."""
        self._put_back(back)
        message = f"could not record the cancel of run {run_id} ({exc}); it is still queued"
        log.warning("%s", message)
        return CancelNotRecorded(f"{message}: ask again")

    async def get(self, run_id: str) -> RunRecord | None:
        """The run's record, or ``None``."""
        await self._ready.wait()
        return await self.ledger.call(lambda s: s.get(run_id))

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        """Runs matching the store's ``list_runs`` filters."""
        await self._ready.wait()
        return await self.ledger.call(lambda s: s.list_runs(**filters))

    async def wait(self, run_id: str, timeout: float) -> RunRecord:
        """The run's record once it has ended, or as it stands after ``timeout``.

        Also returns early, with the record as it stands, when the supervisor
        stops.
        """
        with trio.move_on_after(timeout):
            while not self._stopping:
                # Register before reading: an end recorded in between still wakes us.
                event = trio.Event()
                waiting = self._waiters.setdefault(run_id, [])
                waiting.append(event)
                try:
                    record = await self.get(run_id)
                    if record is None:
                        raise RunNotFound(run_id)
                    if record.is_terminal:
                        return record
                    if self._fleet is None:
                        await event.wait()
                    else:
                        # Another member may end the run: nothing here would
                        # say so, so the ledger is read again every poll.
                        with trio.move_on_after(self._poll_interval()):
                            await event.wait()
                finally:
                    # Leave no event behind for an id nobody waits on any more.
                    if event in waiting:
                        waiting.remove(event)
                    if not waiting and self._waiters.get(run_id) is waiting:
                        del self._waiters[run_id]
        record = await self.get(run_id)
        if record is None:
            raise RunNotFound(run_id)
        return record

    # -- read-only views ------------------------------------------------------

    def run_state(self, run_id: str) -> RunState | None:
        """Where the run stands here: queued, running, held (parked), or None (not here)."""
        return self._life.scheduler.state_of(run_id)

    def parked_runs(self) -> list[str]:
        """Runs held back here because a fleet claim refused them for now, in queue order."""
        return [run.id for run in self._life.scheduler.held_runs()]

    @property
    def fatal(self) -> str | None:
        """Why the supervisor is stopping by itself (the ledger failed, the lease ran out)."""
        return self._fatal

    @property
    def fleet(self) -> FleetMember | None:
        """This supervisor's fleet membership, if it is a member."""
        return self._fleet

    @property
    def worktrees(self) -> WorktreeManager | None:
        """The conversation worktrees' manager, once repositories are configured."""
        return self._worktrees

    @property
    def long_polls(self) -> int:
        """Runs that some :meth:`wait` call waits on now."""
        return len(self._waiters)

    def status(self) -> dict[str, Any]:
        """Limits, running and queued counts, and the oldest wait (see status_view.py)."""
        oldest = next(self._life.scheduler.queued_runs(), None)
        return status_view.status(
            self._life,
            now=self._wall(),
            oldest_submitted_at=None if oldest is None else self._submitted_at[oldest.id],
            generation=self.generation,
            lost_at_startup=len(self.lost_at_startup),
            providers=self.config.providers,
            last_reload=self.last_reload,
            waiting_for_restart=self.waiting_for_restart,
        )

    async def fleet_status(self) -> dict[str, Any] | None:
        """The fleet's members, leases and running runs from the ledger; ``None`` alone.

        Read through the ledger like any read: it never holds up a start.
        A ledger that fails gives ``{"error": ...}`` rather than no status.
        """
        if self._fleet is None:
            return None
        fleet = self._fleet
        try:
            view = await self.ledger.call(fleet.read_view)
        except StoreError as exc:
            return {"error": f"could not read the fleet from the ledger: {exc}"}
        return status_view.fleet_status(view, fleet.store.member_id)

    def accounts(self) -> list[dict[str, Any]]:
        """Every account: in use, usage in its window, resting until, runs started."""
        return self._tracker.accounts()

    async def end_rest(self, provider: str, account: str | None) -> dict[str, Any]:
        """End an account's rest by hand (a limit misread, or bought more quota).

        Raises :class:`UnknownAccount` if the provider has no such account.
        """
        return await self._tracker.end_rest(provider, account)

    async def rest_account(
        self, provider: str, account: str | None, until: float, message: str
    ) -> None:
        """Rest an account until ``until`` (unix seconds), as a usage limit would.

        The simulator restores the rests a rotated trace file carries over.
        An account that is not configured, or a time already past, changes
        nothing.
        """
        await self._tracker.rest(provider, account, until, message)

    def pin_account(self, run_id: str, account: str | None) -> None:
        """Start ``run_id`` on ``account`` if it can take the run then (see ``AccountBook.pin``)."""
        self._life.pin(run_id, account)

    def waiting_for_accounts(self) -> dict[str, dict[str, Any]]:
        """Providers whose queued runs wait because no account can take them: why, until when."""
        return status_view.waiting_for_accounts(self._life, self._wall())

    # -- scheduling and execution -----------------------------------------

    @property
    def _trace_prompts(self) -> bool:
        return self.config.trace.record_prompts

    def _wake(self) -> None:
        self._wakeup.set()
        self.changes.touch()

    async def _emit_in_ledger_order(self, kind: str, **fields: Any) -> None:
        """Trace an event after every change already on its way to the ledger.

        For events that change what may start (a reload, a shutdown): starts
        are traced when their commit lands, so one decided before the event
        must be traced before it too.
        """
        if self._trace is None:
            return
        try:
            await self.ledger.call(lambda _: None, then=lambda _: self._emit(kind, **fields))
        except StoreError as error:
            log.error("%s not traced: the run ledger failed: %s", kind, error)

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._trace is not None:
            self._trace.record(kind, fields)

    def _notify(self, run_id: str) -> None:
        self.changes.touch()
        for event in self._waiters.pop(run_id, ()):
            event.set()

    def _queue_counts(self) -> dict[str, tuple[int, int]]:
        scheduler = self._life.scheduler
        return {
            provider: (scheduler.queued_for(provider), scheduler.running_for(provider))
            for provider in self.config.providers
        }

    async def _dispatch_loop(self) -> None:
        while True:
            # Waiting runs whose accounts all rest are looked at again when
            # the first of those accounts comes back.
            delay = self._until_an_account_frees()
            if delay < math.inf:
                self.account_recheck_at = trio.current_time() + delay
                try:
                    with trio.move_on_at(self.account_recheck_at):
                        await self._wakeup.wait()
                finally:  # also when the loop is cancelled at shutdown
                    self.account_recheck_at = None
            else:  # the common case: no scope to make for a deadline that never comes
                await self._wakeup.wait()
            self._wakeup = trio.Event()
            if self._life.admitting:
                # Waiting for this commit before looking again is what batches
                # starts: whatever frees up meanwhile starts in the next commit.
                await self._start_what_may_start()

    def _until_an_account_frees(self) -> float:
        """Seconds until time alone frees an account some queued run waits for."""
        life = self._life
        if not (life.book.may_free_in_time and life.scheduler.queued_count):
            # Nothing waits, or no account has a budget window or has rested:
            # time alone frees none. No time to read.
            return math.inf
        now = self._wall()
        at = life.next_wakeup(now)
        # At most a minute: this is wall-clock time waited out on trio's
        # monotonic clock, which a suspended laptop or a clock step leaves behind.
        return math.inf if at is None else min(ACCOUNT_RECHECK, max(0.0, at - now))

    async def _start_what_may_start(self) -> None:
        queued = self._queue_starts()
        if queued is not None:
            await self._commit_starts(queued)

    def _queue_starts(self) -> _QueuedStarts | None:
        """Take the runs that may start now and queue their start in the ledger.

        Synchronous: the start joins whatever is queued in the ledger right
        now, and commits in the same transaction (see :meth:`_record_finish`).
        """
        if not self._life.scheduler.queued_count:
            # Nothing waits (most finishes, unless there is a backlog): no
            # time to read, no gate to build, no queue to look through.
            return None
        now = self._wall()
        picks = self._life.take_starts(now, gate=None if self._fleet is None else self._fleet.gate)
        if not picks:
            return None
        items: list[tuple[str, str | None]] = []
        config = self.config
        for run_id, pick in picks.items():
            # Handles exist before the commit so a cancel arriving meanwhile
            # is not lost: RunCancel remembers a cancel made before execute.
            self._handles[run_id] = RunCancel()
            # A run is built from the configuration its start was decided
            # under, whatever a reload changes while its start is recorded.
            self._picks[run_id] = (pick, config)
            items.append((run_id, pick.account))
        pending: Queued[Any]
        if self._fleet is None:
            pending = self.ledger.enqueue(
                lambda s: s.mark_running_many(items, now), durable=True, then=self._started
            )
        else:
            fleet, rules = self._fleet, self._fleet.rules(self.config)
            pending = self.ledger.enqueue(
                lambda _: fleet.store.claim_many(items, now, rules, clock=self._wall),
                durable=True,
                then=self._claimed,
            )
        return _QueuedStarts(list(picks), now, pending)

    async def _commit_starts(self, queued: _QueuedStarts) -> None:
        """Wait for queued starts to commit; without a working ledger, drain and stop."""
        try:
            if self.ledger.committed(queued.pending):
                # Committed with the finish just waited for: nothing to wait
                # for, so nothing to shield (a cancel scope per run costs as
                # much as a trip through the scheduler).
                await self.ledger.result(queued.pending)
            else:
                # Shielded: once queued, the commit happens whatever we do,
                # and its callback must find the run nursery open to hand each
                # run its task (which, if we are being cancelled, records it
                # as cancelled at once).
                with trio.CancelScope(shield=True):
                    await self.ledger.result(queued.pending)
        except StoreError as exc:
            # Not recorded as started, so never spawned: they are still
            # queued in the ledger and will start after a restart. Without
            # a working ledger nothing else can be promised: drain and stop.
            log.critical(
                "the run ledger could not record %d start(s) (%s); "
                "stopping: no run will start until the ledger works again",
                len(queued.runs),
                exc,
            )
            for run_id in queued.runs:
                self._life.give_back(run_id, queued.now)
                self._picks.pop(run_id, None)
                del self._handles[run_id]
            if not self._handles:
                self._idle.set()
            self._fatal = f"the run ledger could not record a start: {exc}"
            self.request_shutdown()

    def _started(self, records: list[RunRecord]) -> None:
        assert self._nursery is not None
        self.changes.touch()
        trace = self._trace
        for record in records:
            if trace is not None:
                trace.start(record.id, record.account)
            if self._counts_runs:
                wait = (record.started_at or record.submitted_at) - record.submitted_at
                self.metrics.count_start(record.provider, max(0.0, wait))
            self._submitted_at.pop(record.id, None)
            pick, config = self._picks.pop(record.id, (None, self.config))
            self._nursery.start_soon(
                self._execute_run, record, pick, config, name=f"run {record.id}"
            )

    # -- fleet membership (see runtime/fleet_member.py) -------------------------

    def _claimed(self, result: ClaimResult) -> None:
        """Start the runs claimed; a run gone leaves the scheduler, one refused is parked.

        A parked run is held by the scheduler until the next poll: its lanes
        stay held, its slot is free at once for a run on another lane.
        """
        fleet = self._fleet
        assert fleet is not None
        self._started(result.claimed)
        now = self._wall()
        parked = False
        for run_id, refused in fleet.refusals(result):
            self._picks.pop(run_id, None)
            if refused is Refused.GONE:  # claimed by another member, or cancelled
                self._submitted_at.pop(run_id, None)
                self._life.give_back(run_id, now)
                self._let_go(run_id)
                continue
            # A cancel asked for meanwhile reads the run after this (the
            # ledger is FIFO) and finds it parked: the handle is not needed.
            del self._handles[run_id]
            if not self._handles:
                self._idle.set()
            if refused is Refused.CAP:
                request = self._life.scheduler.request_of(run_id)
                assert request is not None
                fleet.close(request.provider)
            self._life.hold(run_id, now)
            parked = True
        if parked:
            self._wake()  # its slot is free: a run on another lane may start

    async def _fleet_poll(self) -> None:
        assert self._fleet is not None
        # Accounts first: parked runs go back to the queue (below) with an
        # account view at least as recent as the claim that refused them.
        store, now, window = self._fleet.store, self._wall(), longest_window(self.config)
        await self.ledger.call(
            lambda _: read_fleet_accounts(store, now, window),
            then=partial(self._tracker.take_fleet, now=now),
        )
        held: list[RunRecord] = []
        queued = [run.id for run in self._life.scheduler.queued_runs()]
        await self.ledger.call(
            partial(self._fleet.read_new, queued),
            then=lambda records: held.extend(self._take_fleet_runs(records)),
        )
        if held:
            await self._take_after_removals(held)

    def _take_fleet_runs(self, poll: Poll) -> list[RunRecord]:
        """Queue the fleet's new and re-queued runs in their place by ``seq``; stop cancelled ones.

        Parked runs go back in their place; runs held here that another
        member was asked to cancel are stopped as a local cancel stops them.
        As a submit here waits for a removal of its conversation's worktrees
        under way, so does a run polled: it and every run after it are held
        back and returned, their conversations claimed so that no sweep
        starts removing more of them.
        """
        assert self._fleet is not None
        self._withdraw_left(poll.left)
        self._life.requeue_held()
        self._fleet.reopen()
        records = self._fleet.take_new(poll)
        worktrees = self._worktrees
        cut = len(records)
        if worktrees is not None:
            cut = next(
                (
                    n
                    for n, record in enumerate(records)
                    if record.conversation is not None
                    and worktrees.removal_under_way(record.workspace, record.conversation)
                ),
                cut,
            )
        for record in records[:cut]:
            self._queue_polled(record)
        held = records[cut:]
        self._pending_keys.claim(_conversation_keys(held))
        for run_id, reason in poll.cancels:
            handle = self._handles.get(run_id)
            if handle is not None and not handle.cancelled:
                log.info("run %s: cancel asked through another member (%s)", run_id, reason)
                self._stop(run_id, reason)
        self._wake()
        return held

    def _withdraw_left(self, left: list[str]) -> None:
        """Withdraw runs queued here that left the ledger's queue (taken, ended elsewhere).

        As a claim found ``gone`` does: nothing of them is traced or recorded
        here. Only runs still queued here: one taken for a start since the
        poll's ids were read is settled by its claim.
        """
        for run_id in left:
            if self._life.forget(run_id):
                self._submitted_at.pop(run_id, None)
                self._notify(run_id)

    async def _take_after_removals(self, held: list[RunRecord]) -> None:
        """Queue runs held back by :meth:`_take_fleet_runs` once the removals are done.

        Their records are as the poll read them, maybe long ago: the ledger
        is asked again which are still queued, and only those are queued.
        """
        assert self._worktrees is not None
        assert self._fleet is not None
        try:
            for record in held:
                if record.conversation is not None:
                    await self._worktrees.removal_finished(record.workspace, record.conversation)
        finally:
            self._pending_keys.release(_conversation_keys(held))
        store, ids = self._fleet.store, [record.id for record in held]
        try:
            left = set(await self.ledger.call(lambda _: store.left_queue(ids)))
        except StoreError as exc:
            # Queued as read: the next poll withdraws those that have left.
            log.error("could not read again which polled runs are still queued: %s", exc)
            left = set()
        for record in held:
            if record.id not in left:
                self._queue_polled(record)
        self._wake()

    def _queue_polled(self, record: RunRecord) -> None:
        if not self._life.adopt(run_request(record), seq=record.seq, attempts=record.attempts):
            return
        self._submitted_at[record.id] = record.submitted_at
        self._emit("submit", run=trace_run(record, with_prompt=self._trace_prompts))

    def _poll_interval(self) -> float:
        return self.config.fleet.poll.total_seconds()

    async def _fleet_lease_loop(self) -> None:
        assert self._fleet is not None
        await self._fleet.keep_lease(
            self.ledger, lambda: self.config, self._wall, self._lease_expired
        )

    async def _stop_ended_orphans(self) -> None:
        assert self._orphans is not None
        await self._note_stopped(await self._orphans.stop_ended(self.ledger, ORPHAN_GRACE))

    async def _watch_orphans(self) -> None:
        """Stop orphaned agents as their runs' expiry is seen (by any member), until none is."""
        assert self._orphans is not None
        while self._orphans.watched:
            await trio.sleep(self._poll_interval())
            try:
                await self._stop_ended_orphans()
            except StoreError as exc:
                log.error("could not read the runs of orphaned agents: %s", exc)

    def _lease_expired(self, message: str) -> None:
        # Its runs may be declared lost and run on elsewhere: none may go on
        # here (the fence keeper kills their agents anyway, docs/fleet.md).
        log.critical("%s; stopping its runs and the supervisor", message)
        self._fatal = message
        self.request_shutdown()
        self._life.drain()  # now: the slots freed below must start nothing
        for run_id in sorted(self._handles):
            self._stop(run_id, "this fleet member's lease ran out")

    async def _execute_run(self, record: RunRecord, pick: Pick | None, config: Config) -> None:
        handle = self._handles[record.id]
        ended: ProcessOutcome | None = None
        try:
            spec = None
            if self._prep.prepares_slowly(record, pick, config):
                # Preparing (the checkouts above all) can be slow; a cancel or
                # a shutdown must be able to stop it before anything is spawned.
                with trio.CancelScope() as preparing:
                    self._preparing[record.id] = preparing
                    if handle.cancelled:
                        preparing.cancel()
                    spec = await self._prep.spec_for(record, pick, config)
                self._preparing.pop(record.id, None)
            else:
                # Nothing awaited: nothing a cancel could stop halfway, so no
                # cancel scope (one per run costs as much as a checkpoint),
                # nor a coroutine.
                spec = self._prep.plain_spec(record, config)
            if spec is None or handle.cancelled:
                ended = not_started(Outcome.CANCELLED, handle.reason or "cancel requested")
            else:
                ended = await self._execute(spec, cancel=handle)
        except Exception as exc:  # a run's failure is its own, never the supervisor's
            if not isinstance(exc, OSError):
                log.exception("run %s could not be started", record.id)
            why = why_not_spawned(exc, spec) if isinstance(exc, OSError) else str(exc)
            ended = not_started(Outcome.FAILED, f"could not start {record.provider}: {why}")
        finally:
            self._preparing.pop(record.id, None)
            stop_order = self._stop_order
            if stop_order is not None and record.id in stop_order:
                await self._record_in_turn(record, ended, stop_order)
            else:
                # A task cancelled from outside belongs to a supervisor going
                # down: it records its run's end, and starts nothing after it.
                going_down = trio.current_effective_deadline() == -math.inf
                # A forced shutdown must still record how the run ended:
                # _record_finish waits only in ways a cancel cannot stop.
                await self._record_finish(record, ended, may_start=not going_down)

    async def _record_in_turn(
        self, record: RunRecord, ended: ProcessOutcome | None, stop_order: StopOrder
    ) -> None:
        """Record the end of a run a forced stop cancelled, in submission order."""
        try:
            await stop_order.wait_turn(record.id, record.seq)
            # Nothing starts after a forced stop; every wait in it is one a
            # cancel cannot stop (as for any run's end).
            await self._record_finish(record, ended, may_start=False)
        finally:
            stop_order.done(record.id)

    def _finish_fields(self, ended: ProcessOutcome | None, run_id: str) -> RunEnd:
        """:func:`finish_fields` of a run's end, with the run's log path."""
        return finish_fields(ended, self._prep.log_file(self.config, run_id))

    def _outcome_of(self, ended: ProcessOutcome | None, session: bool) -> RunOutcome:
        """How the run's attempt ended, as the lifecycle settles it."""
        if ended is None:  # the task was cancelled before an outcome existed
            return SHUT_DOWN
        limit = ended.usage_limit
        signals = account_signals(ended)
        if signals is not None:
            if limit is not None:
                limit = UsageLimit(limit.resets_at, as_text(limit.message) or "")
            return RunOutcome(ended.status, ended.exit_code, limit, session, signals)
        if limit is None:
            # One value per distinct ending, shared by every run that ends alike.
            key = (ended.status, ended.exit_code, session)
            plain = self._outcomes.get(key)
            if plain is None:
                plain = RunOutcome(ended.status, ended.exit_code, None, session)
                self._outcomes[key] = plain
            return plain
        message = as_text(limit.message) or ""
        if message != limit.message:  # the rest's message is stored text too
            limit = UsageLimit(limit.resets_at, message)
        return RunOutcome(ended.status, ended.exit_code, limit, session)

    async def _record_finish(
        self, record: RunRecord, ended: ProcessOutcome | None, *, may_start: bool
    ) -> None:
        end = self._finish_fields(ended, record.id)
        session_id = end.session_id
        now = self._wall()
        conversation = record.conversation
        # The lifecycle decides: the status, a usage limit's rest and re-queue
        # (once, recorded in the same transaction, so the run is never lost
        # in between), and whether the slot, lanes and account are free now.
        settled = self._life.finish(record.id, self._outcome_of(ended, bool(session_id)), now)
        status, hit, requeue = settled.status, settled.rest, settled.requeue
        # The usual end (no usage limit to act on) frees the slot, the lanes
        # and the account now, before the finish commits, and queues the
        # starts that frees right behind it: both commit in one transaction,
        # so the ledger never shows the next run on a lane running while this
        # one is not recorded as finished (docs/store.md, "Finish and next
        # start in one commit"). A usage limit first rests the account, once
        # the finish is recorded (Lifecycle.settle), and only then lets the
        # dispatcher look.
        early = settled.freed
        late_charge = charged_once_recorded(ended)
        # The lifecycle's status, where it differs from the process's (a
        # usage limit): the end is copied only then, not for every run.
        recorded = end if end.status is status else attrs.evolve(end, status=status)

        def finish(store: Store) -> RunRecord:
            final = store.finish(record.id, recorded, now)
            if hit is not None:
                store.set_account_limit(hit.provider, hit.account, hit.until, hit.message)
            if requeue:
                # A fleet's ledger cancels it instead if a cancel was
                # asked through another member meanwhile.
                final = store.add_note(
                    record.id, requeue_note(record, settled, store.requeue(record.id))
                )
            if session_id and conversation is not None:
                store.set_conversation_session(
                    record.provider, record.workspace, conversation, session_id, record.account
                )
            return final

        def finished(final: RunRecord) -> None:
            # What the ledger did, not what was asked: it may have cancelled it.
            requeued = requeue and final.status is RunStatus.QUEUED
            if early:
                # When this task takes the starts the finish frees (below), the
                # dispatcher has nothing to look at for it: _take_starts wakes
                # it if it must. (Read after the commit, admitting may have
                # turned false since: then it is woken, to no harm.)
                self._let_go(
                    record.id,
                    wake=not (may_start and self._life.admitting and self._fleet is None),
                )
            else:
                # The slot and lanes first: nothing below may keep them held.
                self._life.settle(record.id, self._wall(), requeued=requeued)
                if requeued:
                    self._submitted_at[record.id] = final.submitted_at
                self._let_go(record.id)
            if hit is not None:
                self._tracker.rested(hit, record.id)
            self._tracker.finished(record.id, final, settled.login, now, charge=late_charge)
            self._report_finish(
                final,
                status if requeued else final.status,
                end.exit_code,
                requeue=requeued,
            )

        starts: _QueuedStarts | None = None
        unrecorded: StoreError | None = None
        try:
            pending = self.ledger.enqueue(finish, then=finished)
            if early and may_start and self._life.admitting:
                starts = self._take_starts()  # nothing awaited since the enqueue
            # The run's task may be cancelled (a forced shutdown): every wait
            # here is one a cancel cannot stop. This one without a shielded
            # scope, which cost about as much as the rest of a finish; the
            # rarer waits below shield themselves when they wait at all.
            # Recorded already (always, on the inline ledger): no coroutine.
            if not pending.committed or pending.error is not None:
                await self.ledger.settled(pending)
        except StoreError as exc:
            unrecorded = exc
        # Committed with the finish already (a value, nothing to handle): no
        # coroutine for it; otherwise it shields its own wait, if it waits.
        if starts is not None and not (starts.pending.committed and starts.pending.error is None):
            await self._commit_starts(starts)
        if unrecorded is not None:
            again = partial(self.ledger.call, finish, then=finished)
            await self._unrecorded_finish(record.id, status, unrecorded, again, early=early)

    async def _unrecorded_finish(
        self,
        run_id: str,
        status: RunStatus,
        exc: StoreError,
        record_again: Callable[[], Awaitable[object]],
        *,
        early: bool,
    ) -> None:
        """The ledger refused a finish: a fleet member tries again; else let the run go.

        ``early``: the run's slot and lanes were freed here before its finish
        was queued (see :meth:`_record_finish`); the ledger holds its lanes
        all the same until the finish is recorded, so a run behind it on one
        of them is refused its claim, and parked, meanwhile.

        A lost connection is retried by a sole supervisor too: the store
        connects again by itself, so this supervisor may run on for long
        after the outage, and a finish let go would leave its run
        ``running`` in the ledger until a restart that may never come.
        """
        retry = self._fleet is not None or isinstance(exc, ConnectionLost)
        if retry and not refused_for_good(exc):
            log.error(
                "could not record how run %s ended (%s): %s; %s",
                run_id,
                status.value,
                exc,
                RETRYING_IN_FLEET,
            )
            # Shielded: the run's task may be cancelled (a forced stop); only
            # the forced stop's own call ends the retries (_retry_finish).
            with trio.CancelScope(shield=True):
                last = await self._retry_finish(run_id, record_again, exc)
            if last is None:
                return
            exc = last
        log.error(
            "could not record how run %s ended (%s): %s; %s",
            run_id,
            status.value,
            exc,
            UNRECORDED if self._fleet is None else UNRECORDED_IN_FLEET,
        )
        # The slot and the lanes are freed all the same; the ledger keeps
        # the run as running until it is reported lost, which is true:
        # its outcome was not recorded.
        if not early:
            self._life.lost(run_id, self._wall())
        self._let_go(run_id)

    async def _retry_finish(
        self, run_id: str, record: Callable[[], Awaitable[object]], refused: StoreError
    ) -> StoreError | None:
        """Record a finish again and again until the ledger takes it (fleet, or a lost connection).

        Meanwhile the ledger holds the run's lanes fleet-wide (and, after a
        usage limit, this member its slot): a finish left unrecorded would
        hold them for as long as this member's lease is renewed. Returns
        ``None`` once it is recorded, else the last refusal: once the ledger
        can never take it (the run was declared lost, the lease lapsed) or a
        forced stop gives up on it (``refused``, the first refusal, if no
        retry was made).
        """
        delay = FINISH_RETRY_FIRST
        last = refused
        with trio.CancelScope() as retrying:
            # Shielded by the caller (its finish must be recorded even in a
            # forced stop): only the forced stop's own call ends this.
            self._finish_retries[run_id] = retrying
            try:
                while True:
                    await trio.sleep(delay)
                    delay = min(2 * delay, FINISH_RETRY_MAX)
                    try:
                        await record()
                    except StoreError as exc:
                        last = exc
                        if refused_for_good(exc):
                            return exc
                        log.warning("run %s: its finish is still not recorded: %s", run_id, exc)
                    else:
                        log.info("run %s: its finish is recorded at last", run_id)
                        return None
            finally:
                del self._finish_retries[run_id]
        return last  # a forced stop gave up on it

    def _report_finish(
        self, final: RunRecord, status: RunStatus, exit_code: int | None, *, requeue: bool
    ) -> None:
        """Trace and count a finish just recorded; deliver its completion callback."""
        # The status's text as a plain str: a StrEnum member's value is its
        # own text, which str.__str__ copies in C where .value is two
        # Python-level calls (the trace writes only exact str values fast).
        text = str.__str__(status)
        spend = final.spend  # None on a re-queue, which clears it: its attempt is not counted
        if self._trace is not None:
            shown = None if spend is None else spend_json(spend)
            self._trace.finish(final.id, text, exit_code, requeued=requeue, spend=shown)
        if self._counts_runs:
            if spend is not None:
                self.metrics.count_spend(final.provider, final.account, spend)
            if not requeue:  # a re-queued run has not finished
                self.metrics.count_finish(final.provider, text)
            if final.started_at is not None and final.finished_at is not None:
                duration = final.finished_at - final.started_at
                self.metrics.observe_duration(final.provider, max(0.0, duration))
        if final.callback_url and final.is_terminal and self._callbacks is not None:
            self._callbacks.start_soon(deliver_callback, final, name=f"callback {final.id}")

    def _let_go(self, run_id: str, *, wake: bool = True) -> None:
        """The run's task is done with it: wake its waiters and the dispatcher.

        ``wake=False``: the caller takes the starts this frees itself.
        """
        del self._handles[run_id]
        self._notify(run_id)
        if not self._handles:
            self._idle.set()
        if wake:
            self._wake()

    def _take_starts(self) -> _QueuedStarts | None:
        """Queue the starts a finish (or an inline submit) allows; wake the dispatcher if it must.

        Called by the task whose change freed or queued the runs, right
        behind it, instead of waking the dispatcher to do it. The
        dispatcher would find nothing more to start now; what it may still
        have to do is set, move or drop its timer for a resting account
        (these starts may have used up an account's budget). Waking it only
        for that spares a scheduling round per run — in the simulator,
        where nothing else happens at that instant, a round that did
        nothing. A fleet member's dispatcher is woken once the finish
        commits, as before (a claim refused there frees a slot).
        """
        # Twice a run: the cheap tests of _queue_starts and
        # _until_an_account_frees first, without their calls.
        life = self._life
        starts = self._queue_starts() if life.scheduler.queued_count else None
        # The starts' time, read a moment ago, if they read it: time passing
        # only frees accounts, so an earlier time can only wake the
        # dispatcher when it need not, which costs nothing but the wake.
        if self._fleet is None and (
            self.account_recheck_at is not None
            or (
                life.book.may_free_in_time
                and life.scheduler.queued_count
                and life.next_wakeup(self._wall() if starts is None else starts.now) is not None
            )
        ):
            self._wake()
        return starts

    def conversation_busy(self, workspace: str, conversation: str) -> bool:
        """Whether a run of the conversation is queued, running, or being submitted."""
        key = conversation_key(workspace, conversation)
        probe = RunRequest("", "", conversation, None, workspace)
        return self._life.is_busy(probe) or self._pending_keys.claimed(key)

    async def sweep_worktrees(self, *, dry_run: bool = False) -> SweepReport:
        """Remove the clean worktrees of idle conversations now (see sweeper.py)."""
        return await self._maintenance.sweep_worktrees(dry_run=dry_run)

    async def list_worktrees(self) -> list[dict[str, Any]]:
        """Every conversation worktree: who, where, last used, clean or dirty, size."""
        if self._worktrees is None:
            return []
        return await describe_worktrees(self._worktrees)

    # -- configuration reload ----------------------------------------------

    def _worktree_manager(self, config: Config) -> WorktreeManager:
        return WorktreeManager(
            self._git if self._git is not None else RealGit(),
            config.supervisor.state_dir / "worktrees",
            config.repos,
            wall=self._wall,
        )

    async def reload(self, trigger: str) -> ReloadResult:
        """Read the configuration file again and apply all of it, or none (see reloading.py).

        Any reload, even of an unchanged file, says the accounts are logged in again.
        """
        if self._life.logged_in():
            self._wake()
        return await self._reloader.reload(trigger)

    async def reload_to(self, written: LoadedConfig, trigger: str) -> ReloadResult:
        """Apply a configuration handed over whole (the simulator's replayed reloads)."""
        return await self._reloader.reload_to(written, trigger)

    async def _apply(self, loaded: LoadedConfig, now: float) -> None:
        """Put a validated configuration with live changes in force, all at once.

        An account that comes back (removed, then added again) gets its rest
        and window usage back from the ledger, as at a restart: read before
        the new configuration is in force, so no start can slip in between.
        """
        settings = settings_of(loaded.config)
        # Over the new configuration's windows: the returning accounts' own.
        history = (
            await self._tracker.history(now, loaded.config)
            if self._life.returning(settings)
            else NO_HISTORY
        )
        self._put_in_force(loaded, history)

    def _put_in_force(self, loaded: LoadedConfig, history: AccountHistory) -> None:
        """Put a validated configuration in force, all at once.

        An account that comes back gets its rest and usage back from ``history``.

        Nothing here can fail half way: the only object built (a worktree
        manager for the first repos) is built before anything is swapped.
        Running runs keep what they started with: their account, timeouts,
        environment and checkouts.
        """
        config = loaded.config
        worktrees = self._worktrees
        if worktrees is None and config.repos:
            worktrees = self._worktree_manager(config)
        self.config = config
        if worktrees is not None:
            # Removed repos keep their worktrees: they are listed, and the
            # sweeper treats them as any other, by idleness.
            worktrees.set_repos(config.repos)
        self._worktrees = worktrees
        self._life.reconfigure(settings_of(config), history.rests(), history.windows())
        self._prep.forget_programs()  # an exec may name another program now
        if self._trace is not None:
            self._trace.set_config(config_as_json(config))  # the next trace file's header
        self._wake()
