"""How the simulator's fake runner says an attempt ended: the runner's own outcome.

Both engines build it here, so each hands the lifecycle what production's
supervisor would make of the same process end (its failure class, its spend
and its account's signals: ``herdsman.runtime.supervisor.outcomes.run_outcome``).
"""

from __future__ import annotations

from herdsman.core.outcome import Outcome, UsageLimit
from herdsman.runtime.runner import ProcessOutcome
from herdsman.sim.workload import Attempt

__all__ = ["LIMIT_MESSAGE", "fake_end"]

#: What a recorded usage limit says, as the fake runner says it.
LIMIT_MESSAGE = "usage limit (recorded)"


def fake_end(attempt: Attempt, reason: str | None) -> ProcessOutcome:
    """How the fake runner reports ``attempt``'s end; ``reason``: why it was stopped, if it was."""
    limit = None
    status = Outcome.SUCCEEDED
    if attempt.outcome == "usage_limited":
        status = Outcome.FAILED
        limit = UsageLimit(attempt.resets_at, LIMIT_MESSAGE)
    elif attempt.outcome != "succeeded":
        status = Outcome(attempt.outcome)
    if status is not Outcome.SUCCEEDED and reason is None:
        reason = f"{attempt.outcome} (recorded)"
    return ProcessOutcome(
        status=status,
        exit_code=attempt.exit_code,
        reason=reason,
        limit=(attempt.limit or "timeout") if status is Outcome.TIMED_OUT else None,
        result="(simulated)" if status is Outcome.SUCCEEDED else None,
        session_id=None,
        excerpt="",
        usage_limit=limit,
        usage=attempt.usage,
        worked=attempt.worked,
    )
