"""A run's end as the ledger records it: its status and fields, stored as text.

Plain functions of a process's outcome, kept apart from the supervisor's
tasks: the simulator's floor benchmark and the tests use them as they are.
"""

from __future__ import annotations

import time

from herdsman.core.accounts import AccountBook
from herdsman.core.lifecycle import Rest, Retry, Settlement
from herdsman.core.outcome import AccountSignals, Outcome, RunOutcome, UsageLimit
from herdsman.runtime.runner import ProcessOutcome
from herdsman.runtime.runner.failure_class import failure_of
from herdsman.runtime.runner.protocols.base import one_line
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
from herdsman.runtime.store.records import Spend

__all__ = [
    "SHUT_DOWN",
    "account_signals",
    "as_text",
    "backoff_text",
    "charged_once_recorded",
    "finish_fields",
    "limit_note",
    "near_limit_mark",
    "refused_for_good",
    "requeue_for_retry",
    "requeue_note",
    "run_outcome",
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


def requeue_for_retry(
    store: Store, final: RunRecord, retry: Retry | None, spent: list[Spend | None]
) -> RunRecord:
    """Re-queue a run whose failed attempt (``final``) was just recorded, if ``retry`` says so.

    The attempt is kept by the ledger and what it spent put in ``spent``
    (the re-queue clears it from the run); the run gets a note.
    """
    spent[:] = [final.spend]
    if retry is None:
        return final
    run_id = final.id
    again = store.requeue(run_id, failure=retry.failure.value, retry_at=retry.at)
    note = f"attempt {again.attempts} failed ({retry.failure.value}); retried {backoff_text(retry)}"
    return store.add_note(run_id, note)


def backoff_text(retry: Retry) -> str:
    """``in 0.73s, at 2026-12-01 15:20:03.412 CET``: the backoff a retry waits, as jittered.

    The delay the run really waits (the policy's backoff jittered down, see
    docs/operations.md, "Retries"), to the hundredth of a second: whole
    seconds would show a 1s backoff jittered to 0.6s as "1s".
    """
    local = time.localtime(retry.at)
    millis = min(999, int((retry.at % 1) * 1000))
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S", local) + f".{millis:03d} " + time.strftime("%Z", local)
    )
    return f"in {retry.delay:.2f}s, at {when}"


def requeue_note(record: RunRecord, settled: Settlement, again: RunRecord) -> str:
    """The note of an attempt moved off its account: a usage limit, or a needed login."""
    if settled.rest is not None:
        return limit_note(record, settled.rest, again)
    assert settled.login is not None
    done = "re-queued for another account" if again.status is RunStatus.QUEUED else "cancelled"
    return (
        f"attempt {record.attempts} found {settled.login.label} not logged in"
        f" ({settled.login.message}); {done}"
    )


def charged_once_recorded(ended: ProcessOutcome | None) -> bool:
    """Whether the run's tokens are charged to its account only once its finish is recorded.

    A stream that reports a session's running totals (Codex) of a named
    session: the run's own share is what the ledger works out from the
    session's earlier runs (``RunRecord.spend``), so the account is charged
    that, not the totals.
    """
    usage = None if ended is None else ended.usage
    return (
        usage is not None
        and usage.session_totals
        and usage.tokens is not None
        and ended is not None
        and ended.session_id is not None
    )


def account_signals(ended: ProcessOutcome) -> AccountSignals | None:
    """What the run's stream said of its account: its spend, a warning, a refused login."""
    usage = ended.usage
    if usage is None:
        return None
    tokens = None
    if usage.tokens is not None and not charged_once_recorded(ended):
        tokens = usage.tokens.budgeted
    near = usage.near_limit
    login = None
    if usage.needs_login:
        login = as_text(one_line(ended.reason)) if ended.reason else None
        login = login or "the provider refused its credentials"
    if tokens is None and usage.cost_usd is None and near is None and login is None:
        return None
    return AccountSignals(
        tokens=tokens,
        usd=usage.cost_usd,
        near_limit=near is not None,
        near_limit_until=None if near is None else near.resets_at,
        needs_login=login,
    )


def near_limit_mark(
    book: AccountBook, provider: str, account: str | None, now: float
) -> float | None:
    """Until when ``book`` holds ``account`` near its limit at ``now``; None if it does not.

    What a provider's warning made of the account at the finish that
    reported it (the supervisor traces it as ``near_limit``; the
    simulator's fast engine reads it the same way). Rare: one warned run
    in many, so the statuses are built whole rather than kept indexed.
    """
    for status in book.statuses(now):
        if status.provider == provider and status.account == account and not status.retired:
            return status.near_limit_until
    return None


def run_outcome(ended: ProcessOutcome, session: bool) -> RunOutcome:
    """How a process's end is settled by the lifecycle (``session``: it reported one).

    Its account's signals (spend, a warning, a refused login), its usage
    limit (its message as stored text) and its retry class: the one reading
    the supervisor and the simulator's engines share.
    """
    limit = ended.usage_limit
    signals = account_signals(ended)
    if limit is not None:
        message = as_text(limit.message) or ""
        if message != limit.message:  # the rest's message is stored text too
            limit = UsageLimit(limit.resets_at, message)
        if signals is None:
            return RunOutcome(ended.status, ended.exit_code, limit, session)
    return RunOutcome(
        ended.status,
        ended.exit_code,
        limit,
        session,
        signals,
        failure=failure_of(ended),
        worked=ended.worked,
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
