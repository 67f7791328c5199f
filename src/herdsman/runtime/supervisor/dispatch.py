"""The dispatcher: takes the runs that may start and records their start.

:class:`Dispatcher` owns the dispatch loop and the queueing of starts in the
ledger (``mark_running_many``, or a fleet member's claim), and, once a
start commits, hands each run to its task (:mod:`.execution`). A finish or
an inline submit takes the starts it frees itself, right behind it
(:meth:`Dispatcher.take_starts`), rather than wake the loop. It writes the
runs' handles and picks (:class:`~.shared.Shared`) and nothing else of the
runs' state.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from herdsman.runtime.fleet_member import Refused
from herdsman.runtime.ledger import Queued
from herdsman.runtime.runner import RunCancel
from herdsman.runtime.store import RunRecord, StoreError
from herdsman.runtime.supervisor.shared import Service, Shared

if TYPE_CHECKING:
    from herdsman.runtime.store.fleet import ClaimResult
    from herdsman.runtime.supervisor.execution import Execution

__all__ = ["ACCOUNT_RECHECK", "Dispatcher", "QueuedStarts"]

log = logging.getLogger("herdsman.supervisor")

#: The longest the dispatcher waits before looking at resting accounts again.
ACCOUNT_RECHECK = 60.0


class QueuedStarts:
    """Starts queued in the ledger and not yet known to be committed.

    A plain class: one is made for nearly every run, and a frozen attrs
    class stores each field through a call of ``object.__setattr__``.
    """

    __slots__ = ("now", "pending", "runs")

    def __init__(self, runs: list[str], now: float, pending: Queued[Any]) -> None:
        self.runs = runs
        self.now = now
        self.pending = pending


class Dispatcher(Service):
    """Starts what may start: the dispatch loop, and the starts a finish frees.

    ``request_shutdown`` is called when the ledger cannot record a start.
    Each started run's task is :meth:`Execution.execute_run` of
    ``execution``, which the facade sets once both services exist (each
    calls the other).
    """

    #: The run tasks' service (set by the facade right after both are made).
    execution: Execution

    def __init__(self, shared: Shared, *, request_shutdown: Callable[[], None]) -> None:
        super().__init__(shared)
        self._request_shutdown = request_shutdown
        #: When (trio time) the dispatcher looks again at runs waiting for a
        #: resting account, if any wait: the simulator advances time to it.
        self.account_recheck_at: float | None = None

    async def dispatch_loop(self) -> None:
        while True:
            # Waiting runs whose accounts all rest are looked at again when
            # the first of those accounts comes back.
            delay = self._until_an_account_frees()
            if delay < math.inf:
                self.account_recheck_at = trio.current_time() + delay
                try:
                    with trio.move_on_at(self.account_recheck_at):
                        await self._shared.wakeup.wait()
                finally:  # also when the loop is cancelled at shutdown
                    self.account_recheck_at = None
            else:  # the common case: no scope to make for a deadline that never comes
                await self._shared.wakeup.wait()
            self._shared.wakeup = trio.Event()
            if self._life.admitting:
                # Waiting for this commit before looking again is what batches
                # starts: whatever frees up meanwhile starts in the next commit.
                await self._start_what_may_start()

    def _until_an_account_frees(self) -> float:
        """Seconds until time alone frees an account some queued run waits for."""
        life = self._life
        if not life.may_wake_in_time or not life.admitting:
            # Nothing waits, or no account has a budget window or has rested
            # and no run waits out a backoff: time alone frees none. No time to read.
            # Nor while draining: nothing starts, and a backoff that ended
            # stays due, so waiting for it would wake the loop at once, forever.
            return math.inf
        now = self._wall()
        at = life.next_wakeup(now)
        # At most a minute: this is wall-clock time waited out on trio's
        # monotonic clock, which a suspended laptop or a clock step leaves behind.
        return math.inf if at is None else min(ACCOUNT_RECHECK, max(0.0, at - now))

    async def _start_what_may_start(self) -> None:
        queued = self._queue_starts()
        if queued is not None:
            await self.commit_starts(queued)

    def _queue_starts(self) -> QueuedStarts | None:
        """Take the runs that may start now and queue their start in the ledger.

        Synchronous: the start joins whatever is queued in the ledger right
        now, and commits in the same transaction (see ``Execution._record_finish``).
        """
        if not self._life.waiting:
            # Nothing waits (most finishes, unless there is a backlog): no
            # time to read, no gate to build, no queue to look through.
            return None
        now = self._wall()
        picks = self._life.take_starts(now, gate=None if self._fleet is None else self._fleet.gate)
        if not picks:
            return None
        # The same moment on the trace's clock: the start lines say it (a
        # replay decides then, though the commit traces them late).
        decided = None if self._trace is None else self._trace.now()
        items: list[tuple[str, str | None]] = []
        config = self._shared.config
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
                lambda s: s.mark_running_many(items, now),
                durable=True,
                then=lambda records: self._started(records, decided),
            )
        else:
            fleet, rules = self._fleet, self._fleet.rules(self._shared.config)
            pending = self.ledger.enqueue(
                lambda _: fleet.store.claim_many(items, now, rules, clock=self._wall),
                durable=True,
                then=lambda result: self._claimed(result, decided),
            )
        return QueuedStarts(list(picks), now, pending)

    async def commit_starts(self, queued: QueuedStarts) -> None:
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
                self._shared.idle.set()
            self._shared.fatal = f"the run ledger could not record a start: {exc}"
            self._request_shutdown()

    def _started(self, records: list[RunRecord], decided: float | None = None) -> None:
        """Trace and spawn the runs whose start just committed, decided at ``decided``.

        ``decided``: a reading of the trace's clock as their start was decided.
        """
        nursery = self._shared.nursery
        assert nursery is not None
        self.changes.touch()
        trace = self._trace
        for record in records:
            if trace is not None:
                trace.start(record.id, record.account, decided)
            if self._counts_runs:
                wait = (record.started_at or record.submitted_at) - record.submitted_at
                self.metrics.count_start(record.provider, max(0.0, wait))
            self._submitted_at.pop(record.id, None)
            pick, config = self._picks.pop(record.id, (None, self._shared.config))
            nursery.start_soon(
                self.execution.execute_run, record, pick, config, name=f"run {record.id}"
            )

    def _claimed(self, result: ClaimResult, decided: float | None = None) -> None:
        """Start the runs claimed; a run gone leaves the scheduler, one refused is parked.

        A parked run is held by the scheduler until the next poll: its lanes
        stay held, its slot is free at once for a run on another lane.
        """
        fleet = self._fleet
        assert fleet is not None
        self._started(result.claimed, decided)
        now = self._wall()
        parked = False
        for run_id, refused in fleet.refusals(result):
            # Which member wins a claim is decided by milliseconds: a replay
            # of the fleet refuses it as recorded (docs/trace-format.md).
            self._emit("claim_refused", run_id=run_id, refusal=refused.value)
            self._picks.pop(run_id, None)
            if refused is Refused.GONE:  # claimed by another member, or cancelled
                self._submitted_at.pop(run_id, None)
                self._life.give_back(run_id, now)
                self.execution.let_go(run_id)
                continue
            # A cancel asked for meanwhile reads the run after this (the
            # ledger is FIFO) and finds it parked: the handle is not needed.
            del self._handles[run_id]
            if not self._handles:
                self._shared.idle.set()
            if refused is Refused.CAP:
                request = self._life.scheduler.request_of(run_id)
                assert request is not None
                fleet.close(request.provider)
            self._life.hold(run_id, now)
            parked = True
        if parked:
            self._wake()  # its slot is free: a run on another lane may start

    def take_starts(self) -> QueuedStarts | None:
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
        starts = self._queue_starts() if life.waiting else None
        # The starts' time, read a moment ago, if they read it: time passing
        # only frees accounts, so an earlier time can only wake the
        # dispatcher when it need not, which costs nothing but the wake.
        if self._fleet is None and (
            self.account_recheck_at is not None
            or (
                life.may_wake_in_time
                and life.next_wakeup(self._wall() if starts is None else starts.now) is not None
            )
        ):
            self._wake()
        return starts
