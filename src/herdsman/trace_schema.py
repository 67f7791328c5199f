"""The decision trace's schema: its format version, each event kind's fields, a run's fields.

docs/trace-format.md is the contract; :mod:`herdsman.trace` writes lines
that follow it and :mod:`herdsman.trace_reading` checks them as it reads.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["EVENT_FIELDS", "OUTCOMES", "RUN_FIELDS", "TRACE_VERSION"]

TRACE_VERSION = 1

#: Event kinds and the fields each must carry (beyond t, seq, event).
EVENT_FIELDS: Mapping[str, frozenset[str]] = {
    "submit": frozenset({"run"}),
    "start": frozenset({"run_id"}),
    "finish": frozenset({"run_id", "outcome"}),
    "cancel": frozenset({"run_id"}),
    "skip": frozenset({"run"}),
    "lost": frozenset({"run_id"}),
    "usage_limit": frozenset({"run_id", "provider", "account", "until"}),
    "rest_ended": frozenset({"provider", "account"}),
    # A run failed to authenticate: its account takes no runs until a reload
    # or an end of its rest (docs/accounts.md).
    "needs_login": frozenset({"run_id", "provider", "account", "message"}),
    # A run's stream warned that its account is near its limit: new
    # conversations go to other accounts first until ``until``.
    "near_limit": frozenset({"run_id", "provider", "account", "until"}),
    "reload": frozenset({"generation", "config"}),
    "reload_rejected": frozenset({"errors"}),
    "shutdown": frozenset(),
    "rotated": frozenset({"next"}),
    # A submit that waits for a removal of its conversation's worktrees (a
    # sweep's): its ``submit`` follows once recorded (docs/trace-format.md).
    "removal_wait": frozenset({"run_id"}),
    # A failed attempt tried again after a backoff: its finish (requeued) follows.
    "retry": frozenset({"run_id", "attempt", "failure", "at"}),
    # A fleet member's part of the fleet (docs/trace-format.md, "Fleet
    # members"): a submit it took, a cancel it asked of the ledger, and a
    # poll that changed its queue.
    "fleet_submit": frozenset({"run"}),
    "fleet_cancel": frozenset({"run_id"}),
    "poll": frozenset({"runs", "left", "cancels"}),
    "claim_refused": frozenset({"run_id", "refusal"}),
}


RUN_FIELDS = frozenset({"id", "provider", "conversation", "agent", "workspace", "cwd", "prompt"})

#: What a finish event's outcome may be.
OUTCOMES = ("succeeded", "failed", "timed_out", "cancelled", "usage_limited")
