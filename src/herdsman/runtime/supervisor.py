"""The supervisor: intake, the scheduling loop and one task per running run.

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
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from operator import methodcaller
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import outcome
import trio

from herdsman.config import Config, ConfigError, LoadedConfig, Provider, format_duration
from herdsman.config.report import config_as_json
from herdsman.core import CancelOutcome, KeyClaims, RunRequest, RunState, Scheduler, busy_keys
from herdsman.core.accounts import Pick, sticky_key
from herdsman.core.lifecycle import Rest
from herdsman.core.runs import conversation_key
from herdsman.executables import resolve_executable
from herdsman.runtime.accounts import (
    account_book,
    account_view,
    blocked_view,
    longest_window,
    returning_accounts,
)
from herdsman.runtime.callbacks import deliver_callback
from herdsman.runtime.changes import Changes
from herdsman.runtime.config_watch import file_signature, watch_file
from herdsman.runtime.fleet_accounts import (
    FleetAccounts,
    apply_fleet_accounts,
    read_fleet_accounts,
)
from herdsman.runtime.fleet_member import FleetMember, Refused
from herdsman.runtime.git import Git, RealGit
from herdsman.runtime.launch import SpecBuilder
from herdsman.runtime.ledger import Ledger, Queued, RunSync, in_worker_thread
from herdsman.runtime.left_agents import LeftAgents
from herdsman.runtime.metrics import Metrics
from herdsman.runtime.orphans import stop_orphans, stopped_note
from herdsman.runtime.reload import (
    Change,
    ConfigSource,
    ReloadResult,
    effective_config,
    given_config,
)
from herdsman.runtime.requests import (
    apply_to_cores,
    limits_of,
    run_request,
    trace_run,
    trace_run_text,
)
from herdsman.runtime.runner import (
    Outcome,
    ProcessOutcome,
    ProcessSpec,
    RunCancel,
    execute,
    not_started,
)
from herdsman.runtime.stop_order import StopOrder
from herdsman.runtime.store import (
    AccountLimit,
    AccountUse,
    NewRun,
    RunEnd,
    RunRecord,
    RunStatus,
    Store,
    StoreConflict,
    StoreError,
)
from herdsman.runtime.store.errors import CommitOutcomeUnknown, ConnectionLost, LeaseExpired
from herdsman.runtime.store.errors import RunNotFound as UnknownRun
from herdsman.runtime.store.records import spend_json
from herdsman.runtime.worktrees.listing import describe_worktrees
from herdsman.runtime.worktrees.manager import WorktreeManager, checkouts_preamble
from herdsman.runtime.worktrees.sweeper import IsBusy, SweepReport, idle_folders, sweep
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
PROVIDER_GONE = (
    "its provider was removed from the configuration; "
    "its queued runs wait until it is configured again"
)


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


class UnknownAccount(Exception):
    """No configured account has this provider and name."""


class RunConflict(Exception):
    """The run is in a state that does not allow the request."""


class CancelNotRecorded(StoreError):
    """The ledger failed to record a cancel: the run is still queued, and may be cancelled again."""


@attrs.frozen
class AccountHistory:
    """What the ledger remembers of accounts: rests in force, runs in their windows."""

    limits: list[AccountLimit]
    uses: list[AccountUse]


class _QueuedStarts:
    """Starts queued in the ledger and not yet known to be committed.

    A plain class: one is made for nearly every run, and a frozen attrs
    class stores each field through a call of ``object.__setattr__``.
    """

    __slots__ = ("now", "pending", "runs")

    def __init__(self, runs: list[RunRequest], now: float, pending: Queued[Any]) -> None:
        self.runs = runs
        self.now = now
        self.pending = pending


@attrs.frozen
class _Withdrawn:
    """A queued (or parked) run a cancel took out of the scheduler: what puts it back."""

    request: RunRequest
    seq: int
    submitted_at: float | None


@attrs.frozen
class ShutdownReport:
    """How the supervisor stopped."""

    drained: bool
    cancelled: tuple[str, ...]
    #: Why the supervisor stopped by itself (the ledger failed), if it did.
    fatal: str | None = None


def _conversation_keys(records: list[RunRecord]) -> list[str]:
    """One key per record in a conversation: each is claimed, and released, once."""
    return [
        conversation_key(record.workspace, record.conversation)
        for record in records
        if record.conversation is not None
    ]


def as_text(value: str | None) -> str | None:
    """``value`` as storable text: an agent's output may carry lone surrogates and NUL."""
    if value is None or (value.isascii() and "\0" not in value):
        # The usual case, checked without copying (isascii is O(1)): ASCII
        # holds no surrogate, and only NUL would need replacing.
        return value
    return value.encode("utf-8", "replace").decode("utf-8").replace("\0", "\ufffd")


def _final(exc: StoreError) -> bool:
    """Whether a refused write can never succeed: the run's state changed, or the lease lapsed."""
    return isinstance(exc, StoreConflict | UnknownRun | LeaseExpired)


def _resumes(record: RunRecord, provider: Provider) -> bool:
    """Whether the run resumes its conversation's session (looked up in the ledger first)."""
    return record.conversation is not None and bool(provider.resume_args)


def _limit_note(record: RunRecord, hit: Rest, again: RunRecord) -> str:
    """The note of an attempt stopped at a usage limit, re-queued (``again``) or cancelled."""
    done = "re-queued" if again.status is RunStatus.QUEUED else "cancelled as asked"
    return (
        f"attempt {record.attempts} stopped at the usage limit of {hit.label}"
        f" ({hit.message}); {done}"
    )


# Each outcome's run status (same value), looked up: converting by value
# (an enum call and ``.value``, both Python-level) cost a microsecond a run.
_STATUS_OF: dict[Outcome, RunStatus] = {outcome: RunStatus(outcome.value) for outcome in Outcome}


def finish_fields(ended: ProcessOutcome | None, log_path: str) -> RunEnd:
    """How a run ended, as the ledger's ``finish`` takes it."""
    if ended is None:  # the task was cancelled before an outcome existed
        return RunEnd(RunStatus.CANCELLED, reason="supervisor shut down", log_path=log_path)
    return RunEnd(
        _STATUS_OF[ended.status],
        exit_code=ended.exit_code,
        reason=as_text(ended.reason),
        result=as_text(ended.result),
        session_id=as_text(ended.session_id),
        excerpt=as_text(ended.excerpt),
        log_path=log_path,
        usage=ended.usage,
    )


class Supervisor:
    """Owns the scheduler, the ledger and the tasks of running runs.

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

    #: Settings the file changed that apply only at the next start, as the
    #: last applied reload found them (a rejected reload changes nothing).
    waiting_for_restart: tuple[Change, ...] = ()

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
        self.generation = 1
        self._source = source
        self._loaded = loaded
        self._stop_orphans = stop_orphans
        self._fleet = fleet
        # A member stops the agents its previous process left once their
        # runs' lease expiry is seen (a sole supervisor does so in _recover).
        self._left = (
            LeftAgents(
                config.supervisor.state_dir, agent_exclusive=config.scheduling.agent_exclusive
            )
            if fleet is not None and stop_orphans
            else None
        )
        self._resolve_program = resolve_program
        self._reload_lock = trio.Lock()
        self._reloaded = trio.Event()
        self.last_reload: ReloadResult | None = None
        # The file as the last reload (or the start) read it: the watcher
        # reloads only when it differs, whoever reloaded last.
        self._config_seen = file_signature(source.path) if source is not None else None
        self.metrics = metrics or Metrics()
        # Run counts that count nothing (the replay's) are not even called.
        self._counts_runs = self.metrics.counts_runs
        self.ledger = Ledger(store, run_sync=run_sync)
        self._execute = execute
        self._wall = wall
        self._trace = trace
        self._scheduler = Scheduler(
            limits_of(config), agent_exclusive=config.scheduling.agent_exclusive
        )
        self._accounts = account_book(config)
        # The account each starting run was given, and the configuration its
        # start was decided under, until its task has read them.
        self._picks: dict[str, tuple[Pick, Config]] = {}
        self._wakeup = trio.Event()
        #: Touched whenever what the dashboard shows may have changed.
        self.changes = Changes()
        #: When (trio time) the dispatcher looks again at runs waiting for a
        #: resting account, if any wait: the simulator advances time to it.
        self.account_recheck_at: float | None = None
        self._admitting = True
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
        self._programs: dict[str, str] = {}
        # Each provider's and account's share of a spec, kept per configuration.
        self._specs = SpecBuilder(os.environ)
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
        self.metrics.config_generation.set(self.generation)
        self.metrics.watch_queue(self._queue_counts)

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
                nursery.start_soon(self._prune_loop)
                nursery.start_soon(self._sweep_loop)
                if self._fleet is not None:
                    nursery.start_soon(self._fleet_lease_loop)
                    nursery.start_soon(self._fleet.poll_loop, self._poll_interval, self._fleet_poll)
                    if self._left is not None and self._left.watched:
                        nursery.start_soon(self._watch_left_agents)
                if self._source is not None and self._source.watch:
                    path = self._source.path
                    nursery.start_soon(watch_file, path, partial(self._config_changed, path))
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
        return self._admitting

    async def _shutdown_when_asked(self) -> ShutdownReport:
        await self._drain_requested.wait()
        self._admitting = False
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
            if self._left is not None:
                await self._left.find(self.ledger)
                await self._stop_left_agents()
            await self._fleet_poll()
            await self._recover_accounts(now)
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
            self._scheduler.submit(run_request(record))
            self._submitted_at[record.id] = record.submitted_at
            # This trace file starts here: it restates what is queued, so it
            # can be replayed on its own.
            self._emit(
                "submit", run=trace_run(record, with_prompt=self._trace_prompts), carried=True
            )
        await self._recover_accounts(now)

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

    async def _recover_accounts(self, now: float) -> None:
        """Quota windows, exhaustions and conversations' accounts of earlier processes."""
        sessions = await self.ledger.call(lambda s: s.sessions())
        for session in sessions:
            key = sticky_key(session.workspace, session.conversation)
            self._accounts.remember(session.provider, key, session.account)
        # A run lost in a crash (at this start or an earlier one) counts as
        # a start only: the ledger charges it no run-minutes.
        self._restore_accounts(await self._account_history(now, self.config), None)

    async def _account_history(self, now: float, config: Config) -> AccountHistory:
        """Rests in force and usage within the longest quota window of ``config``.

        A fleet member reads only the runs it started: the others' come with
        every poll (``_take_fleet_accounts``), and would count twice.
        """
        window, fleet = longest_window(config), self._fleet

        def usage(store: Store) -> list[AccountUse]:
            if not window:
                return []
            if fleet is None:
                return store.account_usage(now - window)
            return fleet.store.account_usage_by_member(now - window).mine

        limits, uses = await self.ledger.call(lambda s: (s.account_limits(now), usage(s)))
        return AccountHistory(limits, uses)

    def _restore_accounts(
        self, history: AccountHistory, only: set[tuple[str, str | None]] | None
    ) -> None:
        """Rests and window usage from the ledger (``only`` these accounts, if given)."""
        book = self._accounts
        for limit in history.limits:
            if only is None or (limit.provider, limit.account) in only:
                book.rest(limit.provider, limit.account, limit.until, limit.message)
        for use in history.uses:
            if only is None or (use.provider, use.account) in only:
                book.restore_usage(use.provider, use.account, use.started_at, use.finished_at)

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
        if not self._admitting:
            raise NotAdmitting("the supervisor is shutting down and accepts no new runs")
        plan: list[tuple[NewRun, RunRequest, bool]] = []
        claimed: list[str] = []
        scheduler, pending_keys = self._scheduler, self._pending_keys
        agent_exclusive = scheduler.agent_exclusive
        for new, on_busy in items:
            request = run_request(new)
            keys = busy_keys(request, agent_exclusive=agent_exclusive)
            # Submits still in the ledger count as busy too, so a follow-up
            # arriving a moment after its predecessor is still skipped.
            # (Whether it is busy matters only to a submit that skips then.)
            skip = on_busy == "skip" and (
                scheduler.is_busy(request) or any(map(pending_keys.claimed, keys))
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
        takes_starts = self.ledger.applies_at_once and self._fleet is None and self._admitting
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
                    self._scheduler.submit(request)
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
                    and self._scheduler.state_of(record.id) is None
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
        fleet, agent_exclusive = self._fleet, self._scheduler.agent_exclusive
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

    def _withdraw(self, run_id: str) -> tuple[CancelOutcome, _Withdrawn | None]:
        """Take the run out of the scheduler for a cancel; with what puts it back, if removed."""
        request, seq = self._scheduler.request_of(run_id), self._scheduler.seq_of(run_id)
        submitted_at = self._submitted_at.pop(run_id, None)
        withdrawn = self._scheduler.cancel(run_id)
        if withdrawn is not CancelOutcome.REMOVED or request is None or seq is None:
            return withdrawn, None
        return withdrawn, _Withdrawn(request, seq, submitted_at)

    def _put_back(self, back: _Withdrawn | None) -> None:
        """The ledger refused a cancel: the run is still queued there, so it is here again."""
        if back is None or self._scheduler.state_of(back.request.id) is not None:
            return
        # In its place by its seq (the scheduler's, or a member's from the
        # ledger), ahead of the runs that came after it: a conversation's
        # runs start in arrival order, a refused cancel or not.
        self._scheduler.submit(back.request, seq=back.seq)
        if back.submitted_at is not None:
            self._submitted_at[back.request.id] = back.submitted_at
        self._wake()

    async def _cancel_recorded(
        self, run_id: str, reason: str, withdrawn: CancelOutcome, back: _Withdrawn | None
    ) -> RunRecord:
        if withdrawn is CancelOutcome.REMOVED:
            # Recorded with nothing awaited since the withdrawal: a start
            # it frees (the next run on its lanes) is then committed, and
            # traced, after the cancel, never before it.
            return await self._record_cancel(run_id, reason, back)
        record = await self.get(run_id)
        if record is None:
            raise RunNotFound(run_id)
        if withdrawn is CancelOutcome.UNKNOWN and self._scheduler.state_of(run_id) is not None:
            # Its submit was still in flight a moment ago.
            withdrawn, back = self._withdraw(run_id)
        if withdrawn is CancelOutcome.RUNNING:
            # The run may have ended, or gone back to the queue (a usage
            # limit), or been parked (a claim refused), while its record was read.
            state = self._scheduler.state_of(run_id)
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
        if withdrawn is CancelOutcome.UNKNOWN:
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
            "parked": snap.held,
            "running_by_provider": dict(snap.running_by_provider),
            "queued_by_provider": dict(snap.queued_by_provider),
            "parked_by_provider": dict(snap.held_by_provider),
            "queued_by_lane": dict(snap.queued_by_lane),
            "oldest_queued_age": None if age is None else max(0.0, age),
            "lost_at_startup": len(self.lost_at_startup),
            "accounts": self.accounts(),
            "waiting_for_accounts": self.waiting_for_accounts(),
            "waiting_for_provider": {
                provider: PROVIDER_GONE
                for provider in sorted(snap.queued_by_provider)
                if provider not in self.config.providers
            },
            "last_reload": None if self.last_reload is None else self.last_reload.as_json(),
            "waiting_for_restart": [change.as_json() for change in self.waiting_for_restart],
        }

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
        return fleet.describe(view)

    def accounts(self) -> list[dict[str, Any]]:
        """Every account: in use, usage in its window, resting until, runs started."""
        return [account_view(s) for s in self._accounts.statuses(self._wall())]

    async def end_rest(self, provider: str, account: str | None) -> dict[str, Any]:
        """End an account's rest by hand (a limit misread, or bought more quota).

        Raises :class:`UnknownAccount` if the provider has no such account.
        """
        if not self._accounts.knows(provider, account):
            what = "its ambient account" if account is None else f"no account {account!r}"
            raise UnknownAccount(f"provider {provider!r} has {what} configured")

        def cleared(_: None) -> None:
            self._accounts.wake(provider, account)
            log.info("the rest of %s/%s was ended by hand", provider, account or "(ambient)")
            self._emit("rest_ended", provider=provider, account=account)
            self._wake()

        await self.ledger.call(methodcaller("clear_account_limit", provider, account), then=cleared)
        now = self._wall()
        return next(
            account_view(s)
            for s in self._accounts.statuses(now)
            if (s.provider, s.account) == (provider, account) and not s.retired
        )

    async def rest_account(
        self, provider: str, account: str | None, until: float, message: str
    ) -> None:
        """Rest an account until ``until`` (unix seconds), as a usage limit would.

        The simulator restores the rests a rotated trace file carries over.
        An account that is not configured, or a time already past, changes
        nothing.
        """
        if not (math.isfinite(until) and until > self._wall()):
            return
        if not self._accounts.knows(provider, account):
            return

        def rested(_: None) -> None:
            self._accounts.rest(provider, account, until, message)
            self._wake()

        await self.ledger.call(
            methodcaller("set_account_limit", provider, account, until, message), then=rested
        )

    def pin_account(self, run_id: str, account: str | None) -> None:
        """Start ``run_id`` on ``account`` if it can take the run then (see ``AccountBook.pin``)."""
        self._accounts.pin(run_id, account)

    def waiting_for_accounts(self) -> dict[str, dict[str, Any]]:
        """Providers whose queued runs wait because no account can take them: why, until when."""
        now = self._wall()
        waiting = {}
        for provider in self._accounts.providers:
            if self._scheduler.queued_for(provider):
                blocked = self._accounts.blocked(provider, now)
                if blocked is not None:
                    waiting[provider] = blocked_view(blocked)
        return waiting

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
        scheduler = self._scheduler
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
            if self._admitting:
                # Waiting for this commit before looking again is what batches
                # starts: whatever frees up meanwhile starts in the next commit.
                await self._start_what_may_start()

    def _until_an_account_frees(self, now: float | None = None) -> float:
        """Seconds until time alone frees an account some queued run waits for.

        ``now``: the wall time, if the caller has just read it.
        """
        if not (self._accounts.may_free_in_time and self._scheduler.queued_count):
            # Nothing waits, or no account has a budget window or has rested:
            # time alone frees none (next_change is None for every provider).
            # Asked twice a run: no time to read, no provider to look at.
            return math.inf
        if now is None:
            now = self._wall()
        times = [
            t
            for provider in self._accounts.providers
            if self._scheduler.queued_for(provider)
            and not self._accounts.available(provider, now)
            and (t := self._accounts.next_change(provider, now)) is not None
        ]
        # At most a minute: this is wall-clock time waited out on trio's
        # monotonic clock, which a suspended laptop or a clock step leaves behind.
        return min(ACCOUNT_RECHECK, max(0.0, min(times) - now)) if times else math.inf

    async def _start_what_may_start(self) -> None:
        queued = self._queue_starts()
        if queued is not None:
            await self._commit_starts(queued)

    def _queue_starts(self) -> _QueuedStarts | None:
        """Take the runs that may start now and queue their start in the ledger.

        Synchronous: the start joins whatever is queued in the ledger right
        now, and commits in the same transaction (see :meth:`_record_finish`).
        """
        if not self._scheduler.queued_count:
            # Nothing waits (most finishes, unless there is a backlog): no
            # time to read, no gate to build, no queue to look through.
            return None
        now = self._wall()
        gate = self._accounts.gate(now)
        starts = self._scheduler.take_startable(
            gate if self._fleet is None else self._fleet.gate(gate)
        )
        if not starts:
            return None
        items: list[tuple[str, str | None]] = []
        picks, config = gate.picks, self.config
        for run in starts:
            # Handles exist before the commit so a cancel arriving meanwhile
            # is not lost: RunCancel remembers a cancel made before execute.
            self._handles[run.id] = RunCancel()
            # A run is built from the configuration its start was decided
            # under, whatever a reload changes while its start is recorded.
            pick = picks[run.id]
            self._picks[run.id] = (pick, config)
            items.append((run.id, pick.account))
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
        return _QueuedStarts(starts, now, pending)

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
            for run in queued.runs:
                self._scheduler.finish(run.id)
                self._accounts.finish(run.id, queued.now, spawned=False)
                self._picks.pop(run.id, None)
                del self._handles[run.id]
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
                self._release(run_id, spawned=False)
                continue
            self._accounts.finish(run_id, now, spawned=False)
            # A cancel asked for meanwhile reads the run after this (the
            # ledger is FIFO) and finds it parked: the handle is not needed.
            del self._handles[run_id]
            if not self._handles:
                self._idle.set()
            if refused is Refused.CAP:
                request = self._scheduler.request_of(run_id)
                assert request is not None
                fleet.close(request.provider)
            self._scheduler.hold(run_id)
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
            then=partial(self._take_fleet_accounts, now=now),
        )
        held: list[RunRecord] = []
        queued = [run.id for run in self._scheduler.queued_runs()]
        await self.ledger.call(
            partial(self._fleet.read_new, queued),
            then=lambda records: held.extend(self._take_fleet_runs(records)),
        )
        if held:
            await self._take_after_removals(held)

    def _take_fleet_accounts(self, state: FleetAccounts, *, now: float) -> None:
        """Count the other members' runs, and rest accounts as the fleet's ledger says."""
        for provider, account, until in apply_fleet_accounts(self._accounts, state, now):
            name = "(ambient)" if account is None else account
            if until is None:
                log.info("the rest of %s/%s was ended by another fleet member", provider, name)
                self._wake()
            else:
                log.info(
                    "%s/%s rests until %s, as the fleet's ledger records",
                    provider,
                    name,
                    time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(until)),
                )

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
        for run in list(self._scheduler.held_runs()):
            self._scheduler.requeue(run.id)
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
            if self._scheduler.state_of(run_id) is RunState.QUEUED:
                self._scheduler.cancel(run_id)
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
        if self._scheduler.state_of(record.id) is not None:
            return
        self._scheduler.submit(run_request(record), seq=record.seq)
        self._submitted_at[record.id] = record.submitted_at
        self._emit("submit", run=trace_run(record, with_prompt=self._trace_prompts))

    def _poll_interval(self) -> float:
        return self.config.fleet.poll.total_seconds()

    async def _fleet_lease_loop(self) -> None:
        assert self._fleet is not None
        await self._fleet.keep_lease(
            self.ledger, lambda: self.config, self._wall, self._lease_expired
        )

    async def _stop_left_agents(self) -> None:
        assert self._left is not None
        await self._note_stopped(await self._left.stop_ended(self.ledger, ORPHAN_GRACE))

    async def _watch_left_agents(self) -> None:
        """Stop left agents as their runs' expiry is seen (by any member), until none is left."""
        assert self._left is not None
        while self._left.watched:
            await trio.sleep(self._poll_interval())
            try:
                await self._stop_left_agents()
            except StoreError as exc:
                log.error("could not read the runs of agents left running: %s", exc)

    def _lease_expired(self, message: str) -> None:
        # Its runs may be declared lost and run on elsewhere: none may go on
        # here (the fence keeper kills their agents anyway, docs/fleet.md).
        log.critical("%s; stopping its runs and the supervisor", message)
        self._fatal = message
        self.request_shutdown()
        self._admitting = False  # now: the slots freed below must start nothing
        for run_id in sorted(self._handles):
            self._stop(run_id, "this fleet member's lease ran out")

    async def _execute_run(self, record: RunRecord, pick: Pick | None, config: Config) -> None:
        handle = self._handles[record.id]
        ended: ProcessOutcome | None = None
        try:
            spec = None
            if self._prepares_slowly(record, pick, config):
                # Preparing (the checkouts above all) can be slow; a cancel or
                # a shutdown must be able to stop it before anything is spawned.
                with trio.CancelScope() as preparing:
                    self._preparing[record.id] = preparing
                    if handle.cancelled:
                        preparing.cancel()
                    if self._left is not None:
                        await self._left.clear_of(run_request(record))
                    spec = await self._spec_for(record, pick, config)
                self._preparing.pop(record.id, None)
            else:
                # Nothing awaited: nothing a cancel could stop halfway, so no
                # cancel scope (one per run costs as much as a checkpoint),
                # nor a coroutine.
                spec = self._plain_spec(record, config)
            if spec is None or handle.cancelled:
                ended = not_started(Outcome.CANCELLED, handle.reason or "cancel requested")
            else:
                ended = await self._execute(spec, cancel=handle)
        except Exception as exc:  # a run's failure is its own, never the supervisor's
            if not isinstance(exc, OSError):
                log.exception("run %s could not be started", record.id)
            ended = not_started(Outcome.FAILED, f"could not start {record.provider}: {exc}")
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

    def _prepares_slowly(self, record: RunRecord, pick: Pick | None, config: Config) -> bool:
        """Whether getting the run ready may await anything (see :meth:`_spec_for`).

        Agents left running, a moved conversation's note, a session to look
        up, checkouts to make: only a run with none of these (most) is ready
        without a checkpoint.
        """
        if self._left is not None or (pick is not None and pick.moved):
            return True
        if record.conversation is None:
            return False  # neither a session to resume nor checkouts: both need one
        provider = config.providers.get(record.provider)
        return (provider is not None and _resumes(record, provider)) or self._checks_out(record)

    def _checks_out(self, record: RunRecord) -> bool:
        """Whether the run gets checkouts of the configured repositories (prepared first)."""
        return (
            self._worktrees is not None
            and bool(self._worktrees.repos)
            and record.conversation is not None
        )

    def _program(self, provider: Provider) -> str | None:
        """The provider's program, resolved on PATH (None: not found)."""
        program = self._programs.get(provider.exec[0])
        if program is None:
            # Resolved once and remembered: a PATH walk per run costs a stat
            # per folder. A program still missing is looked up again next run.
            program = self._resolve_program(provider.exec[0])
            if program is not None:
                self._programs[provider.exec[0]] = program
        return program

    def _plain_spec(self, record: RunRecord, config: Config) -> ProcessSpec:
        """:meth:`_spec_for` of a run that does not prepare slowly: it has nothing to await."""
        provider = config.providers.get(record.provider)
        if provider is None:
            raise OSError(f"provider {record.provider!r} is no longer configured")
        program = self._programs.get(provider.exec[0]) or self._program(provider)
        return self._specs.spec(record, config, program=program)

    async def _spec_for(self, record: RunRecord, pick: Pick | None, config: Config) -> ProcessSpec:
        provider = config.providers.get(record.provider)
        if provider is None:
            raise OSError(f"provider {record.provider!r} is no longer configured")
        resume: list[str] = []
        conversation = record.conversation
        if pick is not None and pick.moved:
            left = "the ambient environment" if pick.left is None else f"account {pick.left}"
            now_on = (
                "the ambient environment" if pick.account is None else f"account {pick.account}"
            )
            text = (
                f"conversation moved from {left} to {now_on} (its account could not take the"
                " run): it starts a fresh session"
            )
            await self.ledger.call(methodcaller("add_note", record.id, text))
        if conversation is not None and _resumes(record, provider):
            session = await self.ledger.call(
                lambda s: s.conversation_session(record.provider, record.workspace, conversation)
            )
            # A session lives under the account that made it: elsewhere it
            # cannot be resumed, so the run starts a fresh one.
            if session is not None and session.account == record.account:
                resume = [
                    arg.replace("{session}", session.session_id) for arg in provider.resume_args
                ]
        program = self._program(provider)
        note, repos_dir = "", None
        if self._worktrees is not None and conversation is not None and self._checks_out(record):
            checkouts = await self._worktrees.prepare(record.workspace, conversation)
            note = checkouts_preamble(checkouts)
            for failed in (c for c in checkouts if not c.usable):
                text = (
                    f"repository {failed.repo.name} was read-only for this run: "
                    f"it could not be checked out ({failed.error})"
                )
                await self.ledger.call(methodcaller("add_note", record.id, text))
            if any(c.usable for c in checkouts):  # never a folder that was refused (a link)
                repos_dir = self._worktrees.folder(record.workspace, conversation)
        return self._specs.spec(
            record,
            config,
            resume=resume,
            program=program,
            checkouts_note=note,
            repos_dir=repos_dir,
        )

    def _finish_fields(self, ended: ProcessOutcome | None, run_id: str) -> RunEnd:
        """:func:`finish_fields` of a run's end, with the run's log path."""
        return finish_fields(ended, self._specs.log_file(self.config, run_id))

    async def _record_finish(
        self, record: RunRecord, ended: ProcessOutcome | None, *, may_start: bool
    ) -> None:
        end = self._finish_fields(ended, record.id)
        status, session_id = end.status, end.session_id
        now = self._wall()
        conversation = record.conversation
        hit = (
            None
            if ended is None or ended.usage_limit is None
            else self._limit_hit(record, ended, status, now)
        )
        if hit is not None and status is RunStatus.FAILED:
            status = RunStatus.USAGE_LIMITED
        # It never got to work: once, it goes back to the head of its lanes
        # (recorded in the same transaction, so it is never lost in between)
        # — unless someone asked to cancel it meanwhile.
        requeue = (
            hit is not None
            and status is RunStatus.USAGE_LIMITED
            and record.attempts < 2
            and not self._handles[record.id].cancelled
        )
        spawned = ended is not None and ended.exit_code is not None
        # The usual end (no usage limit to act on) frees the slot, the lanes
        # and the account now, before the finish commits, and queues the
        # starts that frees right behind it: both commit in one transaction,
        # so the ledger never shows the next run on a lane running while this
        # one is not recorded as finished (docs/store.md, "Finish and next
        # start in one commit"). A usage limit first rests the account, once
        # the finish is recorded, and only then lets the dispatcher look.
        early = hit is None
        if early:
            self._free(record.id, now, spawned=spawned)
            if session_id and conversation is not None:
                self._stick(record, conversation)

        def finish(store: Store) -> RunRecord:
            final = store.finish(record.id, attrs.evolve(end, status=status), now)
            if hit is not None:
                store.set_account_limit(hit.provider, hit.account, hit.until, hit.message)
                if requeue:
                    # A fleet's ledger cancels it instead if a cancel was
                    # asked through another member meanwhile.
                    final = store.add_note(
                        record.id, _limit_note(record, hit, store.requeue(record.id))
                    )
            if session_id and conversation is not None:
                store.set_conversation_session(
                    record.provider, record.workspace, conversation, session_id, record.account
                )
            return final

        def finished(final: RunRecord) -> None:
            # What the ledger did, not what was asked: it may have cancelled it.
            requeued = requeue and final.status is RunStatus.QUEUED
            # The slot and lanes first: nothing below may keep them held.
            if requeued:
                self._requeue(final)
            elif early:
                # When this task takes the starts the finish frees (below), the
                # dispatcher has nothing to look at for it: _take_starts wakes
                # it if it must. (Read after the commit, _admitting may
                # have turned false since: then it is woken, to no harm.)
                self._let_go(
                    record.id, wake=not (may_start and self._admitting and self._fleet is None)
                )
            else:
                self._release(record.id, spawned=spawned)
            if hit is not None:
                self._rest(hit, record.id)
            if session_id and conversation is not None and not early:
                self._stick(record, conversation)
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
            if early and may_start and self._admitting:
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
        if retry and not _final(exc):
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
        if early:
            self._let_go(run_id)
        else:
            self._release(run_id)

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
                        if _final(exc):
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

    def _limit_hit(
        self, record: RunRecord, ended: ProcessOutcome | None, status: RunStatus, now: float
    ) -> Rest | None:
        """The account rest a run's usage-limit report calls for, if any."""
        limit = ended.usage_limit if ended is not None else None
        # A run that got its work done had quota, whatever it printed; one
        # that timed out or was cancelled after the report is out of quota.
        if limit is None or status is RunStatus.SUCCEEDED:
            return None
        until = self._accounts.rest_until(record.provider, record.account, now, limit.resets_at)
        if until is None:  # the account left the configuration meanwhile
            return None
        return Rest(record.provider, record.account, until, as_text(limit.message) or "")

    def _rest(self, hit: Rest, run_id: str) -> None:
        """Rest the account (the limit is recorded), and say so."""
        self._accounts.rest(hit.provider, hit.account, hit.until, hit.message)
        log.warning(
            "%s reached its usage limit on %s; it rests until %s",
            hit.provider,
            hit.label,
            time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(hit.until)),
        )
        self._emit(
            "usage_limit",
            run_id=run_id,
            provider=hit.provider,
            account=hit.account,
            until=hit.until,
        )

    def _release(self, run_id: str, *, spawned: bool = True) -> None:
        """A run's process is over: free its slot, lanes and account, wake whoever waits."""
        self._free(run_id, self._wall(), spawned=spawned)
        self._let_go(run_id)

    def _free(self, run_id: str, now: float, *, spawned: bool) -> None:
        """Give the run's slot, lanes and account back to the cores, at wall time ``now``.

        A run that never got a process gives its account's budget back.
        """
        self._scheduler.finish(run_id)
        self._accounts.finish(run_id, now, spawned=spawned)

    def _stick(self, record: RunRecord, conversation: str) -> None:
        """The conversation sticks to the account where its session now lives."""
        key = sticky_key(record.workspace, conversation)
        self._accounts.remember(record.provider, key, record.account)

    def _requeue(self, record: RunRecord) -> None:
        """A usage-limited run goes back to its place at the head of its lanes."""
        self._scheduler.requeue(record.id)
        self._accounts.finish(record.id, self._wall())
        self._submitted_at[record.id] = record.submitted_at
        self._let_go(record.id)

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
        starts = self._queue_starts() if self._scheduler.queued_count else None
        # The starts' time, read a moment ago, if they read it: time passing
        # only frees accounts, so an earlier time can only wake the
        # dispatcher when it need not, which costs nothing but the wake.
        if self._fleet is None and (
            self.account_recheck_at is not None
            or (
                self._accounts.may_free_in_time
                and self._until_an_account_frees(None if starts is None else starts.now) < math.inf
            )
        ):
            self._wake()
        return starts

    def conversation_busy(self, workspace: str, conversation: str) -> bool:
        """Whether a run of the conversation is queued, running, or being submitted."""
        key = conversation_key(workspace, conversation)
        probe = RunRequest("", "", conversation, None, workspace)
        return self._scheduler.is_busy(probe) or self._pending_keys.claimed(key)

    @property
    def worktrees(self) -> WorktreeManager | None:
        """The conversations' worktrees (None without repositories configured)."""
        return self._worktrees

    async def sweep_worktrees(self, *, dry_run: bool = False) -> SweepReport:
        """Remove the clean worktrees of idle conversations now (see sweeper.py)."""
        if self._worktrees is None:
            return SweepReport(())
        now, idle = self._wall(), self.config.retention.idle.total_seconds()
        is_busy: IsBusy = self.conversation_busy
        if self._fleet is not None:
            is_busy = await self._busy_in_fleet(self._worktrees, now, idle)
        return await sweep(self._worktrees, now=now, idle=idle, is_busy=is_busy, dry_run=dry_run)

    async def _busy_in_fleet(self, worktrees: WorktreeManager, now: float, idle: float) -> IsBusy:
        """A member's sweep check: busy here, or a run queued or running anywhere in the fleet.

        Runs on other members that this one has not polled, or does not hold,
        are not in its scheduler: the ledger is asked once, before the sweep,
        about the conversations it will look at. (A run submitted elsewhere
        after that may find its worktrees removed: its start here makes them
        again, once the removal is done.)
        """
        assert self._fleet is not None
        store = self._fleet.store
        candidates = [
            (folder.workspace, folder.conversation)
            for folder in idle_folders(worktrees, now=now, idle=idle)
        ]
        elsewhere = await self.ledger.call(lambda _: store.live_conversations(candidates))

        def is_busy(workspace: str, conversation: str) -> bool:
            if (workspace, conversation) in elsewhere:
                return True
            return self.conversation_busy(workspace, conversation)

        return is_busy

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
        """Read the configuration file again and apply all of it, or none.

        One reload at a time; whatever triggered it (SIGHUP, the API, the
        file changing) gets the same result. Settings that cannot change
        live are reported and keep their running values.
        """
        async with self._reload_lock:
            now = self._wall()
            if self._source is None or self._loaded is None:
                return self._rejected(
                    trigger, now, ["this supervisor was started without a file to reload"]
                )
            seen = file_signature(self._source.path)
            last = self.last_reload
            if seen is not None and seen == self._config_seen and last is not None:
                # This very file was reloaded already (the watcher is quick):
                # say what that reload did rather than "no changes".
                log.info(
                    "reload (%s): the file is as the last reload (%s) found it: %s",
                    trigger,
                    last.trigger,
                    "applied" if last.ok else "rejected: " + "; ".join(last.errors),
                )
                return last
            self._config_seen = seen
            try:
                loaded, changes = await trio.to_thread.run_sync(
                    effective_config, self._source, self._loaded
                )
            except ConfigError as error:
                return self._rejected(trigger, now, [str(p) for p in error.problems])
            except Exception as error:  # a bug in the loader must not stop the supervisor
                log.exception("reload (%s): reading the configuration failed", trigger)
                return self._rejected(
                    trigger, now, [f"{self._source.path}: could not be read: {error}"]
                )
            return await self._put_in_force(loaded, changes, trigger, now)

    async def reload_to(self, written: LoadedConfig, trigger: str) -> ReloadResult:
        """Apply a configuration handed over whole (the simulator's replayed reloads)."""
        async with self._reload_lock:
            now = self._wall()
            if self._loaded is None:
                return self._rejected(trigger, now, ["no running configuration to compare with"])
            loaded, changes = given_config(written, self._loaded)
            return await self._put_in_force(loaded, changes, trigger, now)

    async def _put_in_force(
        self, loaded: LoadedConfig, changes: list[Change], trigger: str, now: float
    ) -> ReloadResult:
        if any(change.live for change in changes):
            # An account that comes back (removed, then added again) gets its
            # rest and window usage back from the ledger, as at a restart;
            # read before the new configuration is in force, so no start can
            # slip in between.
            returning = returning_accounts(self._accounts, loaded.config)
            # Over the new configuration's windows: the returning accounts' own.
            history = await self._account_history(now, loaded.config) if returning else None
            self._apply(loaded)
            if history is not None:
                self._restore_accounts(history, returning)
        # Shielded: once applied, a shutdown must not leave it untraced and unreported.
        with trio.CancelScope(shield=True):
            result = await self._report_reload(loaded, changes, trigger, now)
        # Returned outside: a cancel scope may swallow what is raised in it.
        return result  # noqa: RET504

    async def _report_reload(
        self, loaded: LoadedConfig, changes: list[Change], trigger: str, now: float
    ) -> ReloadResult:
        if any(change.live for change in changes):
            # The trace event goes in ledger order: starts decided before
            # the change were queued before this, starts decided after it
            # after, so each start shows under the configuration it was
            # decided with (starts are traced when committed).
            as_json = config_as_json(loaded.config)
            await self._emit_in_ledger_order("reload", generation=self.generation, config=as_json)
        result = ReloadResult(True, self.generation, trigger, now, tuple(changes))
        self.last_reload = result
        self.waiting_for_restart = tuple(change for change in changes if not change.live)
        self.changes.touch()
        self.metrics.last_reload_ok.set(1)
        self.metrics.last_reload_time.set(now)
        if not changes:
            log.info("reload (%s): no changes", trigger)
        for change in changes:
            log.info("reload (%s): %s", trigger, change.describe())
        return result

    def _rejected(self, trigger: str, now: float, errors: list[str]) -> ReloadResult:
        result = ReloadResult(False, self.generation, trigger, now, errors=tuple(errors))
        self.last_reload = result
        self.metrics.last_reload_ok.set(0)
        self.metrics.last_reload_time.set(now)
        log.error("reload (%s) rejected; nothing changed:", trigger)
        for error in errors:
            log.error("  %s", error)
        self._emit("reload_rejected", errors=errors)
        self.changes.touch()
        return result

    def _apply(self, loaded: LoadedConfig) -> None:
        """Put a validated configuration in force, all at once.

        Nothing here can fail half way: the only object built (a worktree
        manager for the first repos) is built before anything is swapped.
        Running runs keep what they started with: their account, timeouts,
        environment and checkouts.
        """
        old, config = self.config, loaded.config
        worktrees = self._worktrees
        if worktrees is None and config.repos:
            worktrees = self._worktree_manager(config)
        self._loaded, self.config = loaded, config
        if worktrees is not None:
            # Removed repos keep their worktrees: they are listed, and the
            # sweeper treats them as any other, by idleness.
            worktrees.set_repos(config.repos)
        self._worktrees = worktrees
        apply_to_cores(self._scheduler, self._accounts, old, config)
        self._programs.clear()  # an exec may name another program now
        self._reloaded.set()  # the retention loops look at their settings again
        self._reloaded = trio.Event()
        self.generation += 1
        self.metrics.config_generation.set(self.generation)
        if self._trace is not None:
            self._trace.set_config(config_as_json(config))  # the next trace file's header
        self._wake()

    async def _config_changed(self, path: Path) -> None:
        """The file may have changed (the watcher says): reload if its content did."""
        # Another trigger may have reloaded this very content meanwhile, and
        # a moment without a file (mid-rename) is no reason to reload.
        current = file_signature(path)
        if current is not None and current != self._config_seen:
            try:
                await self.reload("file changed")
            except Exception:  # the watcher outlives anything one reload does
                log.exception("reload after a change of %s failed", path)

    async def _sleep_or_reload(self, until: float) -> None:
        """Sleep until ``until`` (trio time), but wake early when a reload changes the settings."""
        reloaded = self._reloaded
        with trio.move_on_at(until):
            await reloaded.wait()

    async def _sweep_loop(self) -> None:
        # Settings are read afresh each time: a reload changes the next sweep.
        while True:
            started = trio.current_time()
            # Slept until an absolute time: the time left, recomputed from
            # the clock, can round to a sleep of nothing that never ends on
            # a clock that moves only once every task waits (the simulator's).
            while trio.current_time() < (
                due := started + self.config.retention.sweep_interval.total_seconds()
            ):
                await self._sleep_or_reload(due)
            if self._worktrees is None:
                continue
            try:
                await self.sweep_worktrees()
            except Exception:  # a sweep that fails is tried again next time
                log.exception("worktree sweep failed")

    async def _prune_loop(self) -> None:
        while True:
            keep = self.config.retention.finished_runs.total_seconds()
            cutoff = self._wall() - keep
            try:
                pruned: int = await self.ledger.call(methodcaller("prune", cutoff))
            except StoreError as exc:  # a locked or full disk: try again next time
                log.warning("could not prune finished runs: %s", exc)
            else:
                if pruned:
                    log.info("pruned %d finished run(s) older than %s", pruned, keep)
            await self._sleep_or_reload(trio.current_time() + min(3600.0, max(1.0, keep / 10)))
