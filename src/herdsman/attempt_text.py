"""An earlier attempt of a run as ``herdsman runs RUN_ID`` shows it, from the API's JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herdsman.cli_tables import local_time
from herdsman.spend_text import spend_lines

__all__ = ["attempt_line"]


def attempt_line(attempt: Mapping[str, Any]) -> str:
    """``1: failed (overloaded), exit 1, on work, 2026-12-01 15:20:03; retry at ...; ...``.

    One line an attempt: its outcome and the failure class it was retried
    for (a usage limit's re-queue names none), exit code, account, when it
    ended, when its retry was due, why it ended, and what it spent.
    """
    head = f"{attempt['attempt']}: {attempt['status']}"
    if attempt.get("failure"):
        head += f" ({attempt['failure']})"
    parts = [head]
    if attempt.get("exit_code") is not None:
        parts.append(f"exit {attempt['exit_code']}")
    if attempt.get("account") is not None:
        parts.append(f"on {attempt['account']}")
    if attempt.get("finished_at") is not None:
        parts.append(f"ended {local_time(attempt['finished_at'])}")
    if attempt.get("retry_at") is not None:
        parts.append(f"retry at {local_time(attempt['retry_at'])}")
    line = ", ".join(parts)
    if attempt.get("reason"):
        line += f"; {attempt['reason']}"
    spend = attempt.get("spend")
    if isinstance(spend, Mapping):
        line += f"; spent {spend_lines(spend)[0]}"
    return line
