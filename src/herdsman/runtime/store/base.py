"""The store port: the run ledger every supervisor component writes through."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import outcome

from herdsman.runtime.store.records import NewRun, RunRecord, RunStatus


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
        store call is all-or-nothing on its own, inside a batch too: a call
        that raises is undone alone (the calls an operation made before it
        stay), the operation's exception is returned in its slot
        (``outcome.Error``), and the other operations still commit.
        ``durable`` makes the whole batch (and everything committed before
        it) reach the disk before this returns.
        If the commit itself fails, :class:`StoreError` is raised and nothing
        of the batch is kept.
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

    def finish(
        self,
        run_id: str,
        status: RunStatus,
        now: float,
        *,
        exit_code: int | None = None,
        reason: str | None = None,
        result: str | None = None,
        session_id: str | None = None,
        excerpt: str | None = None,
        log_path: str | None = None,
    ) -> RunRecord:
        """Record the outcome of a run: ``status`` must be a terminal status or usage_limited.

        Sets ``finished_at`` and every outcome field exactly as given. Legal
        from running to any outcome, and from queued to cancelled or skipped.
        """
        ...

    def cancel_queued(self, run_id: str, now: float, reason: str) -> RunRecord:
        """Cancel a run that has not started. A running run raises :class:`StoreConflict`:
        its process must be stopped first and then recorded with :meth:`finish`.
        """
        ...

    def requeue(self, run_id: str) -> RunRecord:
        """Put a usage_limited run back in the queue, keeping its ``seq`` and ``attempts``.

        The attempt's outcome fields (account, times, exit code, reason,
        result, excerpt, log path) are cleared; ``session_id`` is kept.
        """
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
        """Delete terminal runs with ``finished_at < finished_before``; return how many."""
        ...

    def conversation_session(self, provider: str, workspace: str, conversation: str) -> str | None:
        """The provider session to resume for this conversation, if one is remembered."""
        ...

    def set_conversation_session(
        self, provider: str, workspace: str, conversation: str, session_id: str | None
    ) -> None:
        """Remember (or, with ``None``, forget) the session of this conversation."""
        ...

    def counts(self) -> Mapping[RunStatus, int]:
        """How many runs are in each status; every status is present, in enum order."""
        ...

    def close(self) -> None:
        """Release the store. Idempotent; any other call afterwards raises :class:`StoreError`."""
        ...
