"""The supervisor: the facade over the services that take runs in, start them, and see them end.

:class:`Supervisor` makes the services and the state they share
(:class:`~.shared.Shared`), starts their tasks in one nursery, recovers at
start-up, and drains and stops at shutdown; every other call is handed to
the service that owns it: intake (:mod:`.intake`), the dispatcher
(:mod:`.dispatch`), the run tasks (:mod:`.execution`), a fleet member's
polls and lease (:mod:`.fleet`), the account tracker, reload and
maintenance; docs/architecture.md shows the task tree.

Every store call goes through the :class:`~herdsman.runtime.ledger.Ledger`,
which applies calls in the order they were made and group-commits them. The
scheduler, the trace, the metrics and waiters are updated in the ledger's
``then`` callbacks, so they follow the ledger's order exactly. Not
everything: starts are taken by a separate dispatch task that the callbacks
wake, so when a start and another event are ready together, trio's wake-up
order decides which comes first. Harmless in production; the simulator stays
deterministic by delivering one event at a time and letting everything it
sets off settle before the next (sim/driver.py). Events that change what may
start (a reload, a shutdown) are traced in ledger order, after every start
decided before them.

At most once: a run is committed as running (``mark_running_many``, fsynced,
one transaction for a burst of starts) before its process is spawned; a run
found running at start-up is recorded as lost, never re-run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import outcome
import trio

from herdsman.config import Config, LoadedConfig
from herdsman.config.report import config_as_json
from herdsman.core import RunRequest, RunState
from herdsman.core.lifecycle import Lifecycle
from herdsman.core.runs import conversation_key
from herdsman.executables import resolve_executable
from herdsman.runtime import status_view
from herdsman.runtime.fleet_member import FleetMember
from herdsman.runtime.git import Git, RealGit
from herdsman.runtime.ledger import Ledger, RunSync, in_worker_thread
from herdsman.runtime.metrics import Metrics
from herdsman.runtime.orphan_watch import OrphanWatch
from herdsman.runtime.reload import (
    Change,
    ConfigSource,
    ReloadResult,
)
from herdsman.runtime.requests import settings_of
from herdsman.runtime.runner import execute
from herdsman.runtime.store import (
    Attempt,
    NewRun,
    RunRecord,
    Store,
    StoreError,
)
from herdsman.runtime.supervisor.accounts import NO_HISTORY, AccountHistory, AccountTracker
from herdsman.runtime.supervisor.dispatch import Dispatcher
from herdsman.runtime.supervisor.errors import ShutdownReport
from herdsman.runtime.supervisor.execution import Execute, Execution
from herdsman.runtime.supervisor.fleet import Membership
from herdsman.runtime.supervisor.intake import SKIP_REASON, Intake, OnBusy
from herdsman.runtime.supervisor.maintenance import Maintenance
from herdsman.runtime.supervisor.preparation import Preparation
from herdsman.runtime.supervisor.recovery import Recovery
from herdsman.runtime.supervisor.reloading import Reloader
from herdsman.runtime.supervisor.shared import Shared
from herdsman.runtime.supervisor.shutdown import Shutdown
from herdsman.runtime.worktrees.listing import describe_worktrees
from herdsman.runtime.worktrees.manager import WorktreeManager
from herdsman.runtime.worktrees.sweeper import SweepReport
from herdsman.trace import TraceWriter

__all__ = ["SKIP_REASON", "Execute", "OnBusy", "Supervisor"]

log = logging.getLogger("herdsman.supervisor")


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
        self._fleet = fleet
        # A member stops the agents its previous process left once their
        # runs' lease expiry is seen (a sole supervisor does so at recovery).
        self._orphans = (
            OrphanWatch(
                config.supervisor.state_dir, agent_exclusive=config.scheduling.agent_exclusive
            )
            if fleet is not None and stop_orphans
            else None
        )
        self.metrics = metrics or Metrics()
        self.ledger = Ledger(store, run_sync=run_sync)
        self._wall = wall
        self._trace = trace
        # Every rule of a run's life: this supervisor hands it the events.
        self._life = Lifecycle(settings_of(config))
        self._git = git
        self._shared = shared = Shared(
            config,
            life=self._life,
            ledger=self.ledger,
            wall=wall,
            trace=trace,
            metrics=self.metrics,
            fleet=fleet,
            worktrees=self._worktree_manager(config) if config.repos else None,
        )
        self._submitted_at = shared.submitted_at
        self._emit = shared.emit
        self._wake = shared.wake
        #: Touched whenever what the dashboard shows may have changed.
        self.changes = shared.changes
        self._prep = Preparation(
            self.ledger,
            worktrees=lambda: shared.worktrees,
            orphans=self._orphans,
            resolve_program=resolve_program,
        )
        self.finished = trio.Event()
        self.report: ShutdownReport | None = None
        self._reloader = Reloader(
            source,
            loaded,
            wall=wall,
            metrics=self.metrics,
            apply=self._apply,
            logged_in=self._logged_in,
            emit=self._emit,
            emit_in_ledger_order=shared.emit_in_ledger_order,
            changes=self.changes,
        )
        self._tracker = AccountTracker(
            self._life, self.ledger, wall=wall, fleet=fleet, emit=self._emit, wake=self._wake
        )
        self._maintenance = Maintenance(
            self.ledger,
            config=lambda: shared.config,
            worktrees=lambda: shared.worktrees,
            wall=wall,
            is_busy=self.conversation_busy,
            fleet=fleet,
            sleep_until=self._reloader.sleep_until,
        )
        # The services: each calls those made before it, and the dispatcher
        # hands each run it starts to the run tasks' service.
        self._shutdown = Shutdown(shared)
        self._dispatch = Dispatcher(shared, request_shutdown=self._shutdown.request_shutdown)
        self._execution = Execution(
            shared, dispatch=self._dispatch, execute=execute, prep=self._prep, tracker=self._tracker
        )
        self._dispatch.execution = self._execution
        self._intake = Intake(shared, dispatch=self._dispatch)
        self._membership = (
            None
            if fleet is None
            else Membership(
                shared,
                tracker=self._tracker,
                orphans=self._orphans,
                request_shutdown=self._shutdown.request_shutdown,
            )
        )
        self._recovery = Recovery(
            shared,
            tracker=self._tracker,
            membership=self._membership,
            orphans=self._orphans,
            stop_orphans=stop_orphans,
        )
        self.metrics.watch_queue(self._queue_counts)

    @property
    def config(self) -> Config:
        """The configuration in force (a reload replaces it)."""
        return self._shared.config

    @property
    def lost_at_startup(self) -> tuple[str, ...]:
        """The runs found running at start-up and recorded as lost (none for a fleet member)."""
        return self._recovery.lost_at_startup

    @property
    def account_recheck_at(self) -> float | None:
        """When (trio time) the dispatcher looks again at runs waiting for a resting account.

        ``None`` if no run waits for one: the simulator advances time to it.
        """
        return self._dispatch.account_recheck_at

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
        await self._recovery.recover()
        async with trio.open_nursery() as callbacks:
            self._shared.callbacks = callbacks
            async with trio.open_nursery() as nursery:
                self._shared.nursery = nursery
                nursery.start_soon(self._dispatch.dispatch_loop)
                nursery.start_soon(self._maintenance.prune_loop)
                nursery.start_soon(self._maintenance.sweep_loop)
                if self._fleet is not None and self._membership is not None:
                    member = self._membership
                    nursery.start_soon(member.fleet_lease_loop)
                    poll_interval = self._shared.poll_interval
                    nursery.start_soon(self._fleet.poll_loop, poll_interval, member.fleet_poll)
                    if self._orphans is not None and self._orphans.watched:
                        nursery.start_soon(member.watch_orphans)
                if self._reloader.watches:
                    nursery.start_soon(self._reloader.watch)
                self._wake()
                self._shared.ready.set()
                task_status.started(self)
                report = await self._shutdown.shutdown_when_asked()
                # Long polls answer with the record as it stands, now, rather
                # than hold the API's shutdown until they time out.
                self._shared.stopping = True
                for run_id in list(self._shared.waiters):
                    self._shared.notify(run_id)
                nursery.cancel_scope.cancel()
            # Callbacks of the last runs get a short grace, then are dropped.
            callbacks.cancel_scope.deadline = trio.current_time() + 10
        return report

    def request_shutdown(self) -> None:
        """First call: stop admitting and drain. Second call: cancel running runs."""
        self._shutdown.request_shutdown()

    @property
    def admitting(self) -> bool:
        """False once a shutdown was requested."""
        return self._life.admitting

    # -- intake (see intake.py) ----------------------------------------------

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

    def submit_each(
        self, items: Sequence[tuple[NewRun, OnBusy]]
    ) -> Coroutine[Any, Any, list[outcome.Outcome[tuple[RunRecord, bool]]]]:
        """As :meth:`submit_many`, with each item's own result or error (see intake.py).

        The intake's own coroutine, not one wrapping it: every submit of a
        replay comes through here.
        """
        return self._intake.submit_each(items)

    async def cancel(self, run_id: str, reason: str = "cancel requested") -> RunRecord:
        """Cancel a queued run at once, or stop a running one (see :meth:`Intake.cancel`)."""
        return await self._intake.cancel(run_id, reason)

    async def get(self, run_id: str) -> RunRecord | None:
        """The run's record, or ``None``."""
        return await self._intake.get(run_id)

    async def attempts(self, run_id: str) -> list[Attempt]:
        """The run's earlier attempts (re-queued or retried), oldest first."""
        return await self._intake.attempts(run_id)

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        """Runs matching the store's ``list_runs`` filters."""
        return await self._intake.list_runs(**filters)

    async def wait(self, run_id: str, timeout: float) -> RunRecord:
        """The run's record once it has ended, or as it stands after ``timeout``.

        Also returns early, with the record as it stands, when the supervisor
        stops.
        """
        return await self._intake.wait(run_id, timeout)

    # -- read-only views ------------------------------------------------------

    def run_state(self, run_id: str) -> RunState | None:
        """Where the run stands here: queued, running, held (parked), or None (not here)."""
        return self._life.scheduler.state_of(run_id)

    def stop_asked(self, run_id: str) -> bool:
        """Whether a cancel has asked this running run to stop (its end not yet settled)."""
        return self._life.stop_asked(run_id)

    def parked_runs(self) -> list[str]:
        """Runs held back here because a fleet claim refused them for now, in queue order."""
        return [run.id for run in self._life.scheduler.held_runs()]

    @property
    def fatal(self) -> str | None:
        """Why the supervisor is stopping by itself (the ledger failed, the lease ran out)."""
        return self._shared.fatal

    @property
    def fleet(self) -> FleetMember | None:
        """This supervisor's fleet membership, if it is a member."""
        return self._fleet

    @property
    def worktrees(self) -> WorktreeManager | None:
        """The conversation worktrees' manager, once repositories are configured."""
        return self._shared.worktrees

    @property
    def long_polls(self) -> int:
        """Runs that some :meth:`wait` call waits on now."""
        return len(self._shared.waiters)

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

    def _queue_counts(self) -> dict[str, tuple[int, int]]:
        scheduler = self._life.scheduler
        return {
            provider: (scheduler.queued_for(provider), scheduler.running_for(provider))
            for provider in self.config.providers
        }

    def conversation_busy(self, workspace: str, conversation: str) -> bool:
        """Whether a run of the conversation is queued, running, or being submitted."""
        key = conversation_key(workspace, conversation)
        probe = RunRequest("", "", conversation, None, workspace)
        return self._life.is_busy(probe) or self._shared.pending_keys.claimed(key)

    async def sweep_worktrees(self, *, dry_run: bool = False) -> SweepReport:
        """Remove the clean worktrees of idle conversations now (see sweeper.py)."""
        return await self._maintenance.sweep_worktrees(dry_run=dry_run)

    async def list_worktrees(self) -> list[dict[str, Any]]:
        """Every conversation worktree: who, where, last used, clean or dirty, size."""
        if self._shared.worktrees is None:
            return []
        return await describe_worktrees(self._shared.worktrees)

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

        Any applied reload, even of an unchanged file, says the accounts are
        logged in again; a rejected one does not.
        """
        return await self._reloader.reload(trigger)

    async def reload_to(self, written: LoadedConfig, trigger: str) -> ReloadResult:
        """Apply a configuration handed over whole (the simulator's replayed reloads)."""
        return await self._reloader.reload_to(written, trigger)

    def _logged_in(self) -> bool:
        """Free every account that needed a login (an applied reload); whether one did."""
        if not self._life.logged_in():
            return False
        self._wake()
        return True

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
        worktrees = self._shared.worktrees
        if worktrees is None and config.repos:
            worktrees = self._worktree_manager(config)
        self._shared.config = config
        if worktrees is not None:
            # Removed repos keep their worktrees: they are listed, and the
            # sweeper treats them as any other, by idleness.
            worktrees.set_repos(config.repos)
        self._shared.worktrees = worktrees
        self._life.reconfigure(settings_of(config), history.rests(), history.windows())
        self._prep.forget_programs()  # an exec may name another program now
        if self._trace is not None:
            self._trace.set_config(config_as_json(config))  # the next trace file's header
        self._wake()
