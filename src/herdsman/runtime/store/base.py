"""The store port: the run ledger every supervisor component writes through."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import outcome

from herdsman.runtime.store.records import (
    AccountLimit,
    AccountUse,
    Attempt,
    NewRun,
    RunEnd,
    RunRecord,
    RunStatus,
    Session,
)
from herdsman.runtime.store.usage import UsageBy, UsageTotal


class Store(Protocol):
    """The run ledger: every run, its status and its outcome.

    Methods are synchronous; the supervisor decides whether to call them from
    a worker thread (``trio.to_thread``) or inline. Timestamps are always
    passed in as ``now`` (unix seconds) and never read from a clock inside the
    store, so the simulator can drive time.

    Errors are the same in every implementation: a state change on an
    unknown id raises :class:`RunNotFound`; a transition the lifecycle does
    not allow raises :class:`StoreConflict` and changes nothing; anything else
    refused (closed store, non-JSON metadata, non-finite ``now``) raises
    :class:`StoreError`. The lifecycle table is in ``docs/store.md``.
    """

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        """Run several operations (each called with this store) as one commit.

        Group commit: the supervisor's ledger queues the calls that arrive
        while the previous batch commits and applies them together, so one
        commit — and with ``durable`` one fsync — serves all of them. Every
        operation is all-or-nothing: one that raises is undone whole, every
        store call it made included (its finish, say, when the note after
        it fails), its exception is returned in its slot (``outcome.Error``),
        and the other operations still commit. Every store call is
        all-or-nothing on its own too: an operation that catches a call's
        error goes on with the store as it was before that call.
        ``durable`` makes the whole batch (and everything committed before
        it) reach the disk before this returns.
        If the commit itself fails, :class:`StoreError` is raised and nothing
        of the batch is kept; so too if undoing a failed operation or call
        fails (the error names that call's error, which is its cause), and
        then no later operation of the batch is called.

        A crash cannot land between two operations of one batch: they reach
        the file together or not at all. An operation never calls ``apply``
        itself: that raises :class:`RuntimeError` in the operation (a batch is
        one transaction; a nested one would end it early). This is what lets the supervisor
        record a usage_limited outcome and re-queue the run in one batch
        (``finish(run_id, USAGE_LIMITED, ...)`` then ``requeue(run_id)``)
        without anyone seeing the run usage_limited in between. Made in
        one operation, as the supervisor does, a re-queue that raises undoes
        the ``finish`` too; made in two, the ``finish`` stays: the run
        remains usage_limited, which is final.
        """
        ...

    def submit(self, new: NewRun, now: float) -> tuple[RunRecord, bool]:
        """Record ``new`` as queued; return the record and whether it was created.

        Idempotent: an existing id returns the existing record unchanged and
        ``False``, even if the other fields of ``new`` differ.
        """
        ...

    def skip(self, new: NewRun, now: float, reason: str) -> tuple[RunRecord, bool]:
        """Record ``new`` directly as skipped (finished at ``now``, with ``reason``).

        An existing id returns the existing record unchanged and ``False``.
        """
        ...

    def mark_running(self, run_id: str, now: float, account: str | None) -> RunRecord:
        """Move a queued run to running, charging ``account``; count one more attempt.

        Durable when it returns: the supervisor spawns the process only after
        this call, which is what makes a run start at most once.
        """
        ...

    def mark_running_many(
        self, items: Sequence[tuple[str, str | None]], now: float
    ) -> list[RunRecord]:
        """Start several ``(run_id, account)`` pairs at once, all or nothing.

        The records come back in the order of ``items``. One transaction (one
        fsync) for a burst of starts; if any item is illegal (unknown, not
        queued, or listed twice) nothing changes and the error is raised.
        """
        ...

    def finish(self, run_id: str, end: RunEnd, now: float) -> RunRecord:
        """Record how the run's attempt ended: ``end.status`` must be a terminal status.

        Sets ``finished_at`` and every outcome field of ``end`` exactly as
        given. Legal from running to any outcome, and from queued to
        cancelled or skipped. ``usage_limited`` is terminal too; to retry
        such a run, call :meth:`requeue` in the same :meth:`apply` batch.

        ``end.usage`` is kept as the record's :class:`Spend`. When its
        counts are a session's running totals (Codex), what the earlier runs
        of the same session in the same conversation spent (their recorded
        spends, summed) is taken off, so the run records its own spend
        (:func:`~herdsman.runtime.store.records.needs_before`).
        """
        ...

    def cancel_queued(self, run_id: str, now: float, reason: str) -> RunRecord:
        """Cancel a run that has not started. A running run raises :class:`StoreConflict`:
        its process must be stopped first and then recorded with :meth:`finish`.
        """
        ...

    def requeue(
        self, run_id: str, *, failure: str | None = None, retry_at: float | None = None
    ) -> RunRecord:
        """Put a usage_limited (or, for a retry, failed or timed_out) run back in the queue.

        Its ``seq`` and ``attempts`` stay. The attempt's outcome fields
        (account, times, exit code, reason, result, excerpt, log path,
        spend) are cleared from the run, after they are kept as an
        :class:`~herdsman.runtime.store.records.Attempt` (:meth:`attempts`),
        with ``failure`` (the class a retry is made for) and ``retry_at``;
        ``session_id`` is kept. The store allows this at any time, but the
        supervisor calls it only in the :meth:`apply` batch whose
        :meth:`finish` recorded the attempt, so waiters and :meth:`prune`
        may treat such a run that stays as final.
        """
        ...

    def attempts(self, run_id: str) -> list[Attempt]:
        """The run's earlier attempts that :meth:`requeue` kept, oldest first."""
        ...

    def add_note(self, run_id: str, note: str) -> RunRecord:
        """Append ``note`` to the run's notes, whatever its status.

        Notes record what a client should know beyond the outcome (a
        repository that could not be checked out for the run, say). An
        unknown id raises :class:`RunNotFound`.
        """
        ...

    def get(self, run_id: str) -> RunRecord | None:
        """The run with ``run_id``, or ``None``."""
        ...

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        provider: str | None = None,
        conversation: str | None = None,
        workspace: str | None = None,
        limit: int = 100,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[RunRecord]:
        """Runs matching every given filter, newest first (descending ``seq``), at most ``limit``.

        ``after_seq`` keeps runs with ``seq > after_seq`` (what is new since
        a poll); ``before_seq`` keeps runs with ``seq < before_seq`` (the next
        page: pass the last ``seq`` of the previous page).
        """
        ...

    def queued_in_order(self) -> list[RunRecord]:
        """Every queued run in submission order (ascending ``seq``)."""
        ...

    def recover(self, now: float) -> list[RunRecord]:
        """After a restart: every running run becomes lost; return them by ``seq``.

        Their reason is exactly :data:`LOST_ON_RESTART`. Nothing is re-queued:
        the process may have done its work, and a run must not run twice.
        """
        ...

    def prune(self, finished_before: float) -> int:
        """Delete terminal runs with ``finished_at < finished_before``; return how many.

        usage_limited runs are terminal and go too.
        """
        ...

    def conversation_session(
        self, provider: str, workspace: str, conversation: str
    ) -> Session | None:
        """The provider session to resume for this conversation, if one is remembered."""
        ...

    def set_conversation_session(
        self,
        provider: str,
        workspace: str,
        conversation: str,
        session_id: str | None,
        account: str | None = None,
    ) -> None:
        """Remember (or, with ``session_id`` ``None``, forget) the session of this conversation.

        ``account`` is the account whose config directory holds the session;
        ``None`` is the provider's ambient environment. Setting again
        replaces both. When forgetting, ``account`` is ignored.
        """
        ...

    def sessions(self) -> list[Session]:
        """Every remembered session, ordered by (provider, workspace, conversation)."""
        ...

    def set_account_limit(
        self, provider: str, account: str | None, until: float, message: str
    ) -> None:
        """Record that ``account`` hit ``provider``'s usage limit until ``until`` (unix seconds).

        One limit per (provider, account): setting again replaces ``until``
        and ``message``. ``account`` ``None`` is the ambient environment; an
        empty account name, a non-finite ``until`` or text SQLite cannot hold
        raise :class:`StoreError`.
        """
        ...

    def account_limits(self, now: float) -> list[AccountLimit]:
        """The limits still in force at ``now`` (``until > now``).

        Ordered by provider, then account with ``None`` (ambient) first.
        Expired limits are not deleted, only left out.
        """
        ...

    def clear_account_limit(self, provider: str, account: str | None) -> None:
        """Forget the limit of (provider, account); nothing happens if there is none."""
        ...

    def account_usage(self, since: float) -> list[AccountUse]:
        """Runs charged to an account that count for quota windows reaching back to ``since``.

        A run counts if its account is set and it started at or after
        ``since``, finished at or after ``since``, or is still running — but
        not if it ended without an exit code (other than ``lost``): it was
        never spawned and spent nothing, as the account tracker counts it.
        A ``lost`` run's use ends when it started: it counts as a start and
        is charged no run-minutes, whenever it was lost (its real end is
        unknown; charging it the outage would block its account long after).
        Each earlier attempt of a re-queued or retried run (:meth:`attempts`)
        counts as a run of its own, under the account, start, end and spend
        it kept, by the same rules (it has ended). Ordered by ``started_at``;
        at equal starts the runs' own rows by ``seq``, then earlier attempts
        by ``seq`` and attempt.
        """
        ...

    def usage(self, by: UsageBy, since: float | None = None) -> list[UsageTotal]:
        """What the attempts that finished at or after ``since`` spent, grouped ``by``.

        Every attempt with a spend counts: each run's newest
        (``RunRecord.spend``) and its earlier ones (``Attempt.spend``), each
        under the account it spent; ``since`` ``None`` is the whole ledger.
        Totals are summed in submission order, a run's oldest attempt first,
        and sorted by group (:func:`~herdsman.runtime.store.usage.usage_totals`).
        """
        ...

    def counts(self) -> Mapping[RunStatus, int]:
        """How many runs are in each status; every status is present, in enum order."""
        ...

    def close(self) -> None:
        """Release the store. Idempotent; any other call afterwards raises :class:`StoreError`."""
        ...
