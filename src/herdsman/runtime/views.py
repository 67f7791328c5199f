"""The JSON shapes the API returns and the CLI prints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from herdsman.runtime.store import Attempt, RunRecord
from herdsman.runtime.store.records import spend_json
from herdsman.runtime.store.spend import spend_total


def attempt_view(attempt: Attempt) -> Mapping[str, Any]:
    """The JSON shape of an earlier attempt of a run (``earlier_attempts``)."""
    return {
        "attempt": attempt.attempt,
        "status": attempt.status.value,
        "account": attempt.account,
        "started_at": attempt.started_at,
        "finished_at": attempt.finished_at,
        "exit_code": attempt.exit_code,
        "reason": attempt.reason,
        # The failure class it was retried for; null: a usage limit's re-queue.
        "failure": attempt.failure,
        "retry_at": attempt.retry_at,
        "spend": None if attempt.spend is None else spend_json(attempt.spend),
    }


def run_view(record: RunRecord, attempts: Sequence[Attempt] | None = None) -> Mapping[str, Any]:
    """The JSON shape of a run in the API and CLI.

    ``attempts``: its earlier attempts, shown as ``earlier_attempts`` when
    given (a single run's view; listings leave them out), with
    ``total_spend``, what all its attempts spent together (``spend`` is its
    newest attempt's alone).
    """
    view: dict[str, Any] = {
        "id": record.id,
        "status": record.status.value,
        "provider": record.provider,
        "conversation": record.conversation,
        "agent": record.agent,
        "workspace": record.workspace,
        "cwd": record.cwd,
        "seq": record.seq,
        "submitted_at": record.submitted_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "account": record.account,
        "exit_code": record.exit_code,
        "reason": record.reason,
        "result": record.result,
        "session_id": record.session_id,
        "excerpt": record.excerpt,
        "log_path": record.log_path,
        "attempts": record.attempts,
        "notes": list(record.notes),
        "callback_url": record.callback_url,
        "metadata": dict(record.metadata),
        "prompt": record.prompt,
        # What its last attempt spent: null where the stream said nothing.
        "spend": None if record.spend is None else spend_json(record.spend),
    }
    if attempts is not None:
        view["earlier_attempts"] = [attempt_view(attempt) for attempt in attempts]
        total = spend_total([*(attempt.spend for attempt in attempts), record.spend])
        view["total_spend"] = None if total is None else spend_json(total)
    return view
