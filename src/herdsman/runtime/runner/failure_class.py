"""The retry class of a failed attempt (:class:`~herdsman.core.retry.Failure`), from its outcome.

What the lifecycle's retry rule reads (docs/operations.md, "Retries"): the
API failure the agent's stream reported, else how its process ended. Only a
failure can retry: a success, a cancel, a usage limit (the account rests and
the run moves instead), a wall-clock timeout and a run never spawned have no
class; nor has an API failure that repeats whatever is tried (a login,
billing or a refused request).
"""

from __future__ import annotations

from typing import Final

from herdsman.core.outcome import Outcome
from herdsman.core.retry import Failure
from herdsman.runtime.runner.api_failure import ApiFailure
from herdsman.runtime.runner.spec import ProcessOutcome

__all__ = ["failure_of"]

_OF_API: Final[dict[ApiFailure, Failure | None]] = {
    ApiFailure.OVERLOADED: Failure.OVERLOADED,
    ApiFailure.SERVER_ERROR: Failure.SERVER_ERROR,
    ApiFailure.RATE_LIMIT: Failure.RATE_LIMIT,
    ApiFailure.CONNECTION: Failure.CONNECTION,
    ApiFailure.OTHER: Failure.API_ERROR,
    ApiFailure.AUTHENTICATION: None,
    ApiFailure.BILLING: None,
    ApiFailure.INVALID_REQUEST: None,
}


def failure_of(ended: ProcessOutcome) -> Failure | None:
    """The class a retry policy knows ``ended`` by; None: no failure it could retry.

    A run the idle timeout stopped is ``idle_timeout`` whatever its stream
    said before; a failed process whose stream reported an API failure has
    that failure's class; one that reported none is a ``crash``.
    """
    status = ended.status
    if status is Outcome.SUCCEEDED or status is Outcome.CANCELLED:
        return None
    if ended.exit_code is None or ended.usage_limit is not None:
        return None
    if status is Outcome.TIMED_OUT:
        return Failure.IDLE_TIMEOUT if ended.limit == "idle_timeout" else None
    usage = ended.usage
    api = None if usage is None else usage.failure
    return Failure.CRASH if api is None else _OF_API[api]
