"""Execution: one task a running run, from its preparation to its recorded finish.

:class:`Execution` owns the run tasks: a run's preparation and process,
how its end is settled by the lifecycle and recorded in the ledger (with
the starts it frees, in the same commit), a finish the ledger refused (let
go, or recorded again), and the trace, metrics and completion callback of
each finish. It lets a run go (its handle) once its task is done with it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Protocol

import attrs
import trio

from herdsman.config import Config
from herdsman.core.accounts import Pick
from herdsman.core.lifecycle import Retry
from herdsman.core.outcome import RunOutcome
from herdsman.core.retry import Failure
from herdsman.runtime.callbacks import deliver_callback
from herdsman.runtime.runner import (
    Outcome,
    ProcessOutcome,
    ProcessSpec,
    RunCancel,
    not_started,
)
from herdsman.runtime.runner.failure_class import failure_of
from herdsman.runtime.runner.spawn_failure import why_not_spawned
from herdsman.runtime.stop_order import StopOrder
from herdsman.runtime.store import RunEnd, RunRecord, RunStatus, Store, StoreError
from herdsman.runtime.store.errors import ConnectionLost
from herdsman.runtime.store.records import Spend, spend_json
from herdsman.runtime.supervisor.accounts import AccountTracker
from herdsman.runtime.supervisor.dispatch import Dispatcher, QueuedStarts
from herdsman.runtime.supervisor.outcomes import (
    SHUT_DOWN,
    account_signals,
    backoff_text,
    charged_once_recorded,
    finish_fields,
    refused_for_good,
    requeue_for_retry,
    requeue_note,
    run_outcome,
)
from herdsman.runtime.supervisor.preparation import Preparation
from herdsman.runtime.supervisor.shared import Service, Shared

__all__ = ["Execute", "Execution"]

log = logging.getLogger("herdsman.supervisor")

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


#: A run's ending as far as its settlement goes: status, exit code, session, failure, work.
_Ending = tuple[Outcome, int | None, bool, Failure | None, bool]


class Execute(Protocol):
    """The spawn port: the real runner, or the simulator's fake one."""

    def __call__(
        self,
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> Awaitable[ProcessOutcome]: ...


class Execution(Service):
    """The run tasks: ``execute`` spawns a run's process once ``prep`` made its spec.

    A finish takes the starts it frees through ``dispatch``; a usage limit's
    rest is handed to ``tracker`` once recorded.
    """

    def __init__(
        self,
        shared: Shared,
        *,
        dispatch: Dispatcher,
        execute: Execute,
        prep: Preparation,
        tracker: AccountTracker,
    ) -> None:
        super().__init__(shared)
        self._dispatch = dispatch
        self._execute = execute
        self._prep = prep
        self._tracker = tracker
        # How runs end, one value per distinct ending (RunOutcome holds nothing of a run).
        self._outcomes: dict[_Ending, RunOutcome] = {}

    async def execute_run(self, record: RunRecord, pick: Pick | None, config: Config) -> None:
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
            stop_order = self._shared.stop_order
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
        return finish_fields(ended, self._prep.log_file(self._shared.config, run_id))

    def _outcome_of(self, ended: ProcessOutcome | None, session: bool) -> RunOutcome:
        """How the run's attempt ended, as the lifecycle settles it."""
        if ended is None:  # the task was cancelled before an outcome existed
            return SHUT_DOWN
        if ended.usage_limit is None and account_signals(ended) is None:
            # One value per distinct ending, shared by every run that ends alike.
            key = (ended.status, ended.exit_code, session, failure_of(ended), ended.worked)
            plain = self._outcomes.get(key)
            if plain is None:
                plain = self._outcomes[key] = run_outcome(ended, session)
            return plain
        return run_outcome(ended, session)

    async def _record_finish(
        self, record: RunRecord, ended: ProcessOutcome | None, *, may_start: bool
    ) -> None:
        end = self._finish_fields(ended, record.id)
        session_id = end.session_id
        # The same moment on the trace's clock too: its finish line says it
        # (a replay ends the attempt then, though its commit traces it late).
        now, read = self._wall(), None if self._trace is None else self._trace.now()
        conversation = record.conversation
        # The lifecycle decides: the status, a usage limit's rest and re-queue
        # (once, recorded in the same transaction, so the run is never lost
        # in between), and whether the slot, lanes and account are free now.
        outcome = self._outcome_of(ended, bool(session_id))
        settled = self._life.finish(record.id, outcome, now)
        status, hit, requeue = settled.status, settled.rest, settled.requeue
        # A retry (Settlement.retry): the attempt is kept and the run re-queued
        # in the finish's own transaction, as a usage limit's re-queue is.
        retry = settled.retry
        spent: list[Spend | None] = []
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
            final = requeue_for_retry(store, store.finish(record.id, recorded, now), retry, spent)
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
            requeued = (requeue or retry is not None) and final.status is RunStatus.QUEUED
            self._tracker.warned(record.id, record.provider, record.account, outcome.account, now)
            self._retried(final, retry)
            if early:
                # When this task takes the starts the finish frees (below), the
                # dispatcher has nothing to look at for it: take_starts wakes
                # it if it must. (Read after the commit, admitting may have
                # turned false since: then it is woken, to no harm.)
                self.let_go(
                    record.id,
                    # A retry's backoff is the dispatcher's to wait out.
                    wake=retry is not None
                    or not (may_start and self._life.admitting and self._fleet is None),
                )
            else:
                # The slot and lanes first: nothing below may keep them held.
                self._life.settle(record.id, self._wall(), requeued=requeued)
                if requeued:
                    self._submitted_at[record.id] = final.submitted_at
                self.let_go(record.id)
            if hit is not None:
                self._tracker.rested(hit, record.id)
            self._tracker.finished(record.id, final, settled.login, now, charge=late_charge)
            self._report_finish(
                final,
                status if requeued else final.status,
                end.exit_code,
                requeue=requeued,
                spent=spent[0] if requeued and spent else None,
                ending=outcome,
                ended=read,
            )

        starts: QueuedStarts | None = None
        unrecorded: StoreError | None = None
        try:
            pending = self.ledger.enqueue(finish, then=finished)
            if early and may_start and self._life.admitting:
                starts = self._dispatch.take_starts()  # nothing awaited since the enqueue
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
            await self._dispatch.commit_starts(starts)
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
        self.let_go(run_id)

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

    def _retried(self, final: RunRecord, retry: Retry | None) -> None:
        """A failed attempt is tried again (``retry``): say so in the log and the trace."""
        if retry is None:
            return
        self._submitted_at[final.id] = final.submitted_at
        log.info(
            "run %s: attempt %d failed (%s); retrying %s",
            final.id,
            retry.attempt,
            retry.failure.value,
            backoff_text(retry),
        )
        if self._trace is not None:
            self._trace.event(
                "retry",
                run_id=final.id,
                attempt=retry.attempt,
                failure=retry.failure.value,
                at=retry.at,
                delay=round(retry.delay, 6),
            )

    def _report_finish(
        self,
        final: RunRecord,
        status: RunStatus,
        exit_code: int | None,
        *,
        requeue: bool,
        spent: Spend | None = None,
        ending: RunOutcome | None = None,
        ended: float | None = None,
    ) -> None:
        """Trace and count a finish just recorded; deliver its completion callback.

        ``spent``: what a re-queued attempt spent (its run's record no longer says).
        ``ended``: when the attempt's end was read, on the trace's clock.
        ``ending``: how the attempt ended, as the lifecycle settled it: a
        failure's retry class, whether the agent did work and whether it
        reported a session are traced (a replay reads them back:
        docs/trace-format.md).
        """
        failure = None if ending is None else ending.failure
        worked = failure is not None and ending is not None and ending.worked
        session = ending is not None and ending.session
        # The status's text as a plain str: a StrEnum member's value is its
        # own text, which str.__str__ copies in C where .value is two
        # Python-level calls (the trace writes only exact str values fast).
        text = str.__str__(status)
        spend = spent if requeue else final.spend
        if spend is not None:
            self._report_spend(
                final,
                spend,
                text,
                exit_code,
                requeue=requeue,
                failure=failure,
                worked=worked,
                session=session,
                ended=ended,
            )
        elif self._trace is not None:
            # The usual finish: its agent's stream said nothing of a spend.
            self._trace.finish(
                final.id,
                text,
                exit_code,
                requeued=requeue,
                failure=failure,
                worked=worked,
                session=session,
                ended=ended,
            )
        if self._counts_runs:
            if not requeue:  # a re-queued run has not finished
                self.metrics.count_finish(final.provider, text)
            if final.started_at is not None and final.finished_at is not None:
                duration = final.finished_at - final.started_at
                self.metrics.observe_duration(final.provider, max(0.0, duration))
        if final.callback_url and final.is_terminal and self._shared.callbacks is not None:
            self._shared.callbacks.start_soon(deliver_callback, final, name=f"callback {final.id}")

    def _report_spend(
        self,
        final: RunRecord,
        spend: Spend,
        text: str,
        exit_code: int | None,
        *,
        requeue: bool,
        failure: Failure | None,
        worked: bool,
        session: bool,
        ended: float | None,
    ) -> None:
        """Trace a finish with what its attempt spent, and count the spend."""
        if self._trace is not None:
            shown = spend_json(spend)
            self._trace.finish(
                final.id,
                text,
                exit_code,
                requeued=requeue,
                spend=shown,
                failure=failure,
                worked=worked,
                session=session,
                ended=ended,
            )
        if self._counts_runs:
            self.metrics.count_spend(final.provider, final.account, spend)

    def let_go(self, run_id: str, *, wake: bool = True) -> None:
        """The run's task is done with it: wake its waiters and the dispatcher.

        ``wake=False``: the caller takes the starts this frees itself.
        """
        del self._handles[run_id]
        self._notify(run_id)
        if not self._handles:
            self._shared.idle.set()
        if wake:
            self._wake()
