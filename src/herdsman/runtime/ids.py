"""Validation of the identifiers clients send, and fresh run ids.

Conversation, agent and workspace ids are opaque to herdsman: any printable
text up to a bound. They are never used raw in a filesystem path (worktree
folders use a slug of them), so ``../x`` is harmless text, while control
characters (NUL included) and unbounded lengths are refused. Run ids do name
files (the run's log), so they are restricted to a safe alphabet.
"""

from __future__ import annotations

import re
import unicodedata
import uuid

MAX_ID_LENGTH = 256
MAX_RUN_ID_LENGTH = 128
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")


def new_run_id() -> str:
    """A fresh, unique run id."""
    return f"run-{uuid.uuid4().hex}"


def id_problem(value: str) -> str | None:
    """Why ``value`` is not an acceptable conversation, agent or workspace id."""
    if not value:
        return "must not be empty"
    if len(value) > MAX_ID_LENGTH:
        return f"must be at most {MAX_ID_LENGTH} characters, got {len(value)}"
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            return f"must not contain control or unassigned characters, found {char!r}"
    return None


def run_id_problem(value: str) -> str | None:
    """Why ``value`` is not an acceptable run id."""
    if len(value) > MAX_RUN_ID_LENGTH:
        return f"must be at most {MAX_RUN_ID_LENGTH} characters, got {len(value)}"
    if not _RUN_ID.fullmatch(value):
        return (
            "must start with a letter or digit and contain only letters, digits, "
            f"'.', '_', ':' and '-', got {value[:40]!r}"
        )
    return None
