"""Intake: submits, cancels, and the reads and long polls of runs.

:class:`Intake` records submits (deduplicated, ``on_busy = "skip"``
decided here, or fleet-wide in the ledger for a member) and queues them in
the lifecycle once recorded; it cancels a queued run (withdrawn at once,
put back if the ledger refuses) or stops a running one, and answers
:meth:`Intake.get`, :meth:`Intake.list_runs` and :meth:`Intake.wait`. It
writes the submit times and the pending keys of the runs' shared state, and
the long polls' waiters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs
import outcome
import trio

from herdsman.core import RunRequest, RunState, busy_keys
from herdsman.core.lifecycle import Admission, Withdrawal
from herdsman.runtime.requests import run_request, trace_run, trace_run_text
from herdsman.runtime.store import (
    Attempt,
    NewRun,
    RunRecord,
    RunStatus,
    Store,
    StoreConflict,
    StoreError,
)
from herdsman.runtime.store.errors import CommitOutcomeUnknown
from herdsman.runtime.supervisor.dispatch import Dispatcher
from herdsman.runtime.supervisor.errors import (
    CancelNotRecorded,
    NotAdmitting,
    RunConflict,
    RunNotFound,
)
from herdsman.runtime.supervisor.shared import Service, Shared

__all__ = ["SKIP_REASON", "Intake", "OnBusy"]

log = logging.getLogger("herdsman.supervisor")

OnBusy = Literal["queue", "skip"]
SKIP_REASON = "its conversation or agent already had a queued or running run"


@attrs.frozen
class _Withdrawn:
    """A queued (or parked) run a cancel took out of the lifecycle: what puts it back."""

    request: RunRequest
    seq: int
    submitted_at: float | None
    #: It started before (a usage limit re-queued it): one never re-queues it again.
    again: bool


class Intake(Service):
    """Takes runs in and cancels them.

    A submit recorded inline takes the starts it allows through ``dispatch``.
    """

    def __init__(self, shared: Shared, *, dispatch: Dispatcher) -> None:
        super().__init__(shared)
        self._dispatch = dispatch

    async def submit_each(
        self, items: Sequence[tuple[NewRun, OnBusy]]
    ) -> list[outcome.Outcome[tuple[RunRecord, bool]]]:
        """As :meth:`submit_many`, with each item's own result or error.

        An item the ledger refuses is undone alone, and the others are
        recorded: each gets its answer. A commit that fails as a whole
        raises, as for a single submit.
        """
        if not self._shared.ready.is_set():  # waiting on a set Event would still yield once
            await self._shared.ready.wait()
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
        worktrees = self._shared.worktrees
        try:
            if worktrees is not None:
                # Claimed above, so no sweep starts removing these
                # conversations' worktrees now; one removal may already be
                # under way: the run is recorded once it has finished.
                for new, _, skip in plan:
                    if not skip and new.conversation is not None:
                        if worktrees.removal_under_way(new.workspace, new.conversation):
                            # What a replay needs to hold it as long (docs/simulator.md).
                            self._emit("removal_wait", run_id=new.id)
                        await worktrees.removal_finished(new.workspace, new.conversation)
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
        trace_prompts = self._shared.config.trace.record_prompts

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
                    # Which member took the submit, for a replay of the fleet.
                    self._emit("fleet_submit", run=trace_run(new, with_prompt=trace_prompts))
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
            starts = self._dispatch.take_starts()
            # Committed already, with nothing to wait for or handle: as
            # always on the inline ledger, no coroutine for it.
            if starts is not None and not (
                starts.pending.committed and starts.pending.error is None
            ):
                await self._dispatch.commit_starts(starts)
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
        await self._shared.ready.wait()
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
                self._shared.stop(run_id, reason)
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
            # A cancel of a run not queued here: a replay of the fleet asks it here too.
            self._emit("fleet_cancel", run_id=run_id)
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
        await self._shared.ready.wait()
        return await self.ledger.call(lambda s: s.get(run_id))

    async def attempts(self, run_id: str) -> list[Attempt]:
        """The run's earlier attempts (re-queued or retried), oldest first."""
        await self._shared.ready.wait()
        return await self.ledger.call(lambda s: s.attempts(run_id))

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        """Runs matching the store's ``list_runs`` filters."""
        await self._shared.ready.wait()
        return await self.ledger.call(lambda s: s.list_runs(**filters))

    async def wait(self, run_id: str, timeout: float) -> RunRecord:
        """The run's record once it has ended, or as it stands after ``timeout``.

        Also returns early, with the record as it stands, when the supervisor
        stops.
        """
        with trio.move_on_after(timeout):
            while not self._shared.stopping:
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
                        with trio.move_on_after(self._shared.poll_interval()):
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
