"""The decisions a trace records, in order: what ``sim diff`` compares and Chrome shows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from herdsman.trace import TraceEvent, read_trace

__all__ = ["DECISIONS", "Decision", "Timeline", "pairs", "read_decisions", "timeline_of"]

#: Event kinds that are decisions (submits, cancels and reloads are inputs).
DECISIONS = frozenset(
    {"start", "finish", "skip", "usage_limit", "lost", "retry", "near_limit", "needs_login"}
)


@attrs.frozen
class Decision:
    """One decision: its kind, run, and what was decided (account, outcome...)."""

    kind: str
    run_id: str
    what: tuple[tuple[str, Any], ...]
    t: float
    line: int

    def describe(self) -> str:
        """``start r7 account=work`` — the decision without its time."""
        details = " ".join(f"{k}={_shown(v)}" for k, v in self.what)
        return f"{self.kind} {self.run_id}" + (f" {details}" if details else "")


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


# What of each decision must match between two traces (times never have to).
_COMPARED = {
    "start": ("account",),
    "finish": ("outcome", "requeued"),
    "skip": (),
    "usage_limit": ("account", "until"),
    "lost": (),
    # Its delay, not when it is due: that is the finish's moment plus the
    # delay, and a replay's moments are the trace's, rounded to microseconds.
    "retry": ("attempt", "failure", "delay"),
    "near_limit": ("account", "until"),
    "needs_login": ("account",),
}


@attrs.frozen
class Timeline:
    """A trace's decisions, and each run's conversation and provider (from its submit)."""

    decisions: tuple[Decision, ...]
    conversations: dict[str, str | None]
    providers: dict[str, str]
    #: When the recording went on in another file (this one ends in ``rotated``).
    rotated_at: float | None = None

    @property
    def rotated(self) -> bool:
        """Whether the recording goes on in another file."""
        return self.rotated_at is not None


def read_decisions(path: Path) -> Timeline:
    """The decisions of the trace at ``path``, in order."""
    header, events = read_trace(path)
    return timeline_of(events, header.carry)


def timeline_of(events: Iterable[TraceEvent], carry: Mapping[str, Any] | None = None) -> Timeline:
    """The decisions among ``events``, in order.

    A rotated file's ``carry`` counts as the starts, at its beginning, of the
    runs running then (a replay of the file alone starts them there).
    """
    decisions: list[Decision] = []
    conversations: dict[str, str | None] = {}
    providers: dict[str, str] = {}
    carry = carry or {}
    for held in carry.get("running", []):
        run = held["run"]
        conversations[run["id"]] = run.get("conversation")
        providers[run["id"]] = run["provider"]
        decisions.append(Decision("start", run["id"], (("account", held.get("account")),), 0.0, 1))
    for run in carry.get("queued", []):
        conversations[run["id"]] = run.get("conversation")
        providers[run["id"]] = run["provider"]
    rotated_at = None
    for event in events:
        fields = event.fields
        if event.event == "rotated":
            rotated_at = event.t
        if event.event in ("submit", "skip"):
            run = fields["run"]
            conversations[run["id"]] = run.get("conversation")
            providers[run["id"]] = run["provider"]
        if event.event not in DECISIONS:
            continue
        run_id = fields["run"]["id"] if event.event == "skip" else fields["run_id"]
        # A field left out and one set to null mean the same; the account
        # is kept even when null (the ambient environment is a pick too).
        what = tuple(
            (key, fields.get(key))
            for key in _COMPARED[event.event]
            if key == "account" or fields.get(key) is not None
        )
        decisions.append(Decision(event.event, run_id, what, event.t, event.line))
    return Timeline(tuple(decisions), conversations, providers, rotated_at)


def pairs(a: Timeline, b: Timeline) -> Iterator[tuple[int, Decision | None, Decision | None]]:
    """Both traces' decisions side by side, index by index."""
    for index in range(max(len(a.decisions), len(b.decisions))):
        left = a.decisions[index] if index < len(a.decisions) else None
        right = b.decisions[index] if index < len(b.decisions) else None
        yield index, left, right
