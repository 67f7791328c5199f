"""A run's end as the ledger records it: its status and fields, stored as text.

Plain functions of a process's outcome, kept apart from the supervisor's
tasks: the simulator's floor benchmark and the tests use them as they are.
"""

from __future__ import annotations

from herdsman.core.lifecycle import Rest, Retry
from herdsman.core.outcome import Outcome, RunOutcome
from herdsman.runtime.runner import ProcessOutcome
from herdsman.runtime.store import (
    RunEnd,
    RunRecord,
    RunStatus,
    Store,
    StoreConflict,
    StoreError,
)
from herdsman.runtime.store.errors import LeaseExpired
from herdsman.runtime.store.errors import RunNotFound as UnknownRun

__all__ = [
    "SHUT_DOWN",
    "as_text",
    "finish_fields",
    "limit_note",
    "refused_for_good",
    "requeue_for_retry",
]

#: How a run ends whose task was cancelled before its process reported (a forced stop).
SHUT_DOWN = RunOutcome(Outcome.CANCELLED)


def as_text(value: str | None) -> str | None:
    """``value`` as storable text: an agent's output may carry lone surrogates and NUL."""
    if value is None or (value.isascii() and "\0" not in value):
        # The usual case, checked without copying (isascii is O(1)): ASCII
        # holds no surrogate, and only NUL would need replacing.
        return value
    return value.encode("utf-8", "replace").decode("utf-8").replace("\0", "\ufffd")


def refused_for_good(exc: StoreError) -> bool:
    """Whether a refused write can never succeed: the run's state changed, or the lease lapsed."""
    return isinstance(exc, StoreConflict | UnknownRun | LeaseExpired)


def limit_note(record: RunRecord, hit: Rest, again: RunRecord) -> str:
    """The note of an attempt stopped at a usage limit, re-queued (``again``) or cancelled."""
    done = "re-queued" if again.status is RunStatus.QUEUED else "cancelled as asked"
    return (
        f"attempt {record.attempts} stopped at the usage limit of {hit.label}"
        f" ({hit.message}); {done}"
    )


def requeue_for_retry(store: Store, run_id: str, retry: Retry) -> RunRecord:
    """Re-queue a run whose failed attempt was just recorded, keeping the attempt, with a note."""
    again = store.requeue(run_id, failure=retry.failure.value, retry_at=retry.at)
    note = (
        f"attempt {again.attempts} failed ({retry.failure.value});"
        f" retried after a backoff of {retry.delay:.0f}s"
    )
    return store.add_note(run_id, note)


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
