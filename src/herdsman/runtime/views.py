"""The JSON shapes the API returns and the CLI prints."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herdsman.runtime.store import RunRecord
from herdsman.runtime.store.records import spend_json


def run_view(record: RunRecord) -> Mapping[str, Any]:
    """The JSON shape of a run in the API and CLI."""
    return {
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
