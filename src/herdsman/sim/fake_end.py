"""How the simulator's fake runner says an attempt ended: the runner's own outcome.

Both engines build it here, so each hands the lifecycle what production's
supervisor would make of the same process end (its failure class, its spend
and its account's signals: ``herdsman.runtime.supervisor.outcomes.run_outcome``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from herdsman.core.outcome import Outcome, RunOutcome, UsageLimit
from herdsman.runtime.runner import ProcessOutcome
from herdsman.sim.workload import Attempt

__all__ = [
    "LIMIT_MESSAGE",
    "NO_ENDING",
    "RECORDED_SESSION",
    "fake_end",
    "finish_ending",
    "stopped_end",
]

#: What a recorded usage limit says, as the fake runner says it.
LIMIT_MESSAGE = "usage limit (recorded)"

#: The session an attempt that reported one reports (the trace keeps no id).
RECORDED_SESSION = "(recorded session)"


def fake_end(attempt: Attempt, reason: str | None) -> ProcessOutcome:
    """How the fake runner reports ``attempt``'s end; ``reason``: why it was stopped, if it was."""
    limit = None
    status = Outcome.SUCCEEDED
    if attempt.outcome == "usage_limited":
        status = Outcome.FAILED
        limit = UsageLimit(attempt.resets_at, LIMIT_MESSAGE)
    elif attempt.outcome != "succeeded":
        status = Outcome(attempt.outcome)
    reported = attempt.reported
    if status is not Outcome.SUCCEEDED and reason is None:
        said = None if reported is None else reported.reason
        reason = said or f"{attempt.outcome} (recorded)"
    return ProcessOutcome(
        status=status,
        exit_code=attempt.exit_code,
        reason=reason,
        limit=(attempt.limit or "timeout") if status is Outcome.TIMED_OUT else None,
        result="(simulated)" if status is Outcome.SUCCEEDED else None,
        session_id=RECORDED_SESSION if reported is not None and reported.session else None,
        excerpt="",
        usage_limit=limit,
        usage=attempt.usage,
        worked=reported is not None and reported.worked,
    )


#: How an attempt ends that a cancel or a forced stop cut short, though the
#: recording let it end otherwise (a what-if): at once, having said nothing.
_CUT_SHORT: Final = Attempt(0.0, "cancelled")


def stopped_end(attempt: Attempt, reason: str | None) -> ProcessOutcome:
    """How the fake runner reports ``attempt``'s end when a cancel (or a forced stop) stops it.

    An attempt the recording saw cancelled ends as it recorded: its exit
    code (the runner's SIGTERM: -15), what its agent's stream had said by
    then (its spend, charged to its account as the supervisor charged it)
    and its session (its conversation keeps to the account). Any other is
    cut short having said nothing: its process never ran in the replay.
    """
    return fake_end(attempt if attempt.outcome == "cancelled" else _CUT_SHORT, reason)


#: The fields a finish without a failure class adds: none.
NO_ENDING: Final[Mapping[str, Any]] = MappingProxyType({})


def finish_ending(outcome: RunOutcome) -> Mapping[str, Any]:
    """What a finish event says of how ``outcome``'s attempt failed, as the supervisor writes it.

    Its retry class (``failure``), and ``worked`` with it when the agent
    may have done work, and ``session`` when it reported a session
    (``TraceWriter.finish``): the fast engine's finishes carry the same
    fields as the supervisor's.
    """
    failure = outcome.failure
    if failure is None:
        return _SESSION if outcome.session else NO_ENDING
    fields: dict[str, Any] = {"failure": failure.value}
    if outcome.worked:
        fields["worked"] = True
    if outcome.session:
        fields["session"] = True
    return fields


_SESSION: Final[Mapping[str, Any]] = MappingProxyType({"session": True})
