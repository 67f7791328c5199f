"""How a recorded attempt ended, as the fake runner must say it for a replay to decide alike.

A trace the supervisor wrote says, around each attempt's ``finish``, what
the lifecycle read in the agent's stream (docs/trace-format.md): the
attempt's spend (the finish's ``spend``), its failure's retry class and
whether the agent did work (``failure``, ``worked``), a warning that its
account is near its limit (``near_limit``, just before the finish), a
refused login (``needs_login``) and a retry (``retry``). A replay hands
these back to the supervisor as the agent's stream would have, in the
run's usage (:class:`~herdsman.runtime.runner.run_usage.RunUsage`) and,
where the finish says its agent reported a session (``session``), a
session of its own (its conversation sticks to the account), so
production's own reading (``run_outcome``, ``failure_of``) decides the
retry, the move, the mark, the budget's charge and the account a
conversation keeps again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import attrs

from herdsman.core.retry import Failure
from herdsman.runtime.runner.api_failure import ApiFailure
from herdsman.runtime.runner.run_usage import (
    ModelUsage,
    RateLimitWarning,
    RunUsage,
    Tokens,
    count,
    usd,
)
from herdsman.trace import TraceFormatError

__all__ = [
    "API_OF_CLASS",
    "SIGNALS",
    "RecordedEnd",
    "Reported",
    "Signals",
    "after_finish",
    "ended_at",
    "note",
    "read_at",
    "recorded_end",
]

#: Each retry class a finish may name, and the API failure its agent's stream
#: reported: none for a crash (the process died with nothing in its stream)
#: or an idle timeout (the runner stopped a silent agent).
API_OF_CLASS: Final[Mapping[Failure, ApiFailure | None]] = {
    Failure.OVERLOADED: ApiFailure.OVERLOADED,
    Failure.SERVER_ERROR: ApiFailure.SERVER_ERROR,
    Failure.RATE_LIMIT: ApiFailure.RATE_LIMIT,
    Failure.CONNECTION: ApiFailure.CONNECTION,
    Failure.API_ERROR: ApiFailure.OTHER,
    Failure.CRASH: None,
    Failure.IDLE_TIMEOUT: None,
}

#: What a failed attempt recorded without a class stands for: an API failure
#: that no retry policy retries (a refused request; billing would do as well).
#: Its process exited, its stream named no class the supervisor retries; the
#: replay says no more of it than the trace did.
UNCLASSED: Final = ApiFailure.INVALID_REQUEST


@attrs.define
class Signals:
    """What the events traced just before a run's ``finish`` said of its attempt."""

    #: A usage limit's rest (``usage_limit``'s ``until``).
    resets_at: float | None = None
    #: The account was marked near its limit until then (``near_limit``).
    warned_until: float | None = None
    #: The login was refused, in these words (``needs_login``'s ``message``).
    login: str | None = None
    #: The attempt was retried, its failure of this class (``retry``'s ``failure``).
    retried: str | None = None
    #: ... after this many seconds (``retry``'s ``delay``).
    delay: float | None = None
    #: ... until then (``retry``'s ``at``, unix seconds), if the trace says.
    due: float | None = None
    #: For the run's next attempt: when the backoff after the last one ended
    #: (its finish plus the retry's delay), which its start may answer.
    backoff_until: float | None = None

    @property
    def more(self) -> bool:
        """Whether they said more than a usage limit: a warning, a refused login, a retry."""
        return self.warned_until is not None or self.login is not None or self.retried is not None


@attrs.frozen
class Reported:
    """What a recorded attempt's agent did beyond its spend and failure: a run's ``reported``.

    ``worked``: it may have done work before it failed; ``reason``: why it
    failed, in the runner's words (a refused login's message; None: the
    fake runner's own); ``session``: it reported a session.
    """

    worked: bool = False
    reason: str | None = None
    session: bool = False


@attrs.frozen
class RecordedEnd:
    """The attempt's end as the fake runner reports it: the :class:`Attempt` fields it sets."""

    outcome: str
    usage: RunUsage | None
    limit: str | None
    reported: Reported | None


#: The events traced just before a finish that say something of its attempt.
SIGNALS: Final = frozenset({"usage_limit", "near_limit", "needs_login", "retry"})


def note(signals: Signals, kind: str, fields: Mapping[str, Any]) -> None:
    """Keep what an event of :data:`SIGNALS` says of the attempt whose finish follows."""
    if kind == "usage_limit":
        signals.resets_at = float(fields["until"])
    elif kind == "near_limit":
        signals.warned_until = float(fields["until"])
    elif kind == "needs_login":
        signals.login = str(fields["message"])
    else:
        signals.retried = fields["failure"]
        signals.delay = float(fields.get("delay", 0.0))
        due = fields.get("at")
        signals.due = float(due) if isinstance(due, int | float) else None


def after_finish(
    signals: dict[str, Signals],
    run_id: str,
    t: float,
    started_at: float,
    before: float,
    *,
    read: float | None = None,
    settled: float = -math.inf,
) -> tuple[Signals, float]:
    """What was said of the attempt of ``run_id`` whose finish was traced at ``t``, and when
    a replay ends it (:func:`read_at`, else :func:`ended_at`); taken out of ``signals``.

    ``started_at``: the trace header's time (unix seconds); ``before``: when
    a replay that agrees meets the last event traced before the finish that
    is not one of its own signals (a start that answered a retried
    attempt's end comes with that end, before the finish was traced).
    ``read``: the finish's ``ended``, if it has one; ``settled``: as
    ``before``, submits, skips and a fleet's polls left out (see
    :func:`read_at`). A
    retried attempt leaves the end of its backoff behind, for its run's
    next start.
    """
    said = signals.pop(run_id, _NO_SIGNALS)
    end = ended_at(t, said, started_at, before) if read is None else read_at(t, read, settled)
    if said.retried is not None and said.delay is not None:
        signals[run_id] = Signals(backoff_until=end + said.delay)
    return said, end


#: The trace's resolution: a replay's moments are the trace's, to the microsecond.
TICK: Final = 1e-6


def ended_at(t: float, said: Signals, started_at: float, before: float) -> float:
    """When a replay ends the attempt whose finish was traced at ``t``.

    The supervisor reads the time when an attempt's process ends, and only
    then records the finish in the ledger and traces it; a retry's backoff
    runs from that reading (the retry's ``at`` is it plus the ``delay``).
    Under load the commit takes tens of milliseconds, and a replay that
    ended the attempt at the finish's trace time would end its backoff that
    much later than the recording did: after another run's finish that the
    recording traced after the retry's start, or the other way round. So a
    retried attempt ends at that reading (``at`` less ``delay``, in trace
    time), the supervisor's own moment, as its next start was timed from.
    Its order among the other events must stay the recorded one: never
    before ``before`` (the last event traced ahead of it; a wall clock
    stepped back would say so), never after ``t`` (nor a clock stepped on).
    Anything else ends at ``t``.
    """
    if said.due is None or said.delay is None:
        return t
    read = round(said.due - said.delay - started_at, 6)
    return min(t, max(read, round(before + TICK, 6)))


def read_at(t: float, read: float, settled: float) -> float:
    """When a replay ends the attempt whose finish, traced at ``t``, says it was read at ``read``.

    The supervisor reads the time as an attempt's process ends, queues the
    finish in the ledger at once (with the starts the freed slot allows,
    decided then), and traces it once committed: tens or hundreds of
    milliseconds later under load, the commits queued ahead of it first.
    The finish's ``ended`` is that reading, and the replay ends the
    attempt there, as the recorded supervisor decided from it. That may
    come before a submit (or a fleet member's poll) traced ahead of the
    finish: its line is written as its commit ends, and its runs are
    queued only then, so a finish read while that commit was under way
    decided without them, as the replay does when it ends the attempt
    before the submit arrives. Never before ``settled``, when the replay
    meets the last event traced ahead of the finish that is none of those
    (the ledger's order kept: a cancel, say, may have taken its run out of
    the queue before the reading); never after ``t``.
    """
    return min(t, max(read, round(settled + TICK, 6)))


#: Nothing was said.
_NO_SIGNALS: Final = Signals()


def recorded_end(where: str, fields: Mapping[str, Any], signals: Signals) -> RecordedEnd:
    """How the attempt whose ``finish`` has ``fields`` ended; ``where`` names the line.

    :class:`TraceFormatError` if the finish names an unknown failure class or
    a malformed spend.
    """
    outcome: str = fields["outcome"]
    failure = _failure(where, fields.get("failure", signals.retried))
    api: ApiFailure | None = None
    limit = None
    if signals.login is not None:
        api = ApiFailure.AUTHENTICATION
        if outcome == "usage_limited":
            # Moved to another account: the lifecycle's word; its process failed.
            outcome = "failed"
    elif failure is not None:
        api = API_OF_CLASS[failure]
        if failure is Failure.IDLE_TIMEOUT:
            limit = "idle_timeout"
    elif outcome == "failed" and fields.get("exit_code") is not None:
        api = UNCLASSED
    spend = fields.get("spend")
    tokens, cost, models, turns, api_time = _spend(where, spend) if spend is not None else _NONE
    warning = None
    if signals.warned_until is not None:
        warning = RateLimitWarning(signals.warned_until, None)
    usage = RunUsage(
        tokens=tokens,
        cost_usd=cost,
        models=models,
        turns=turns,
        api_time=api_time,
        near_limit=warning,
        failure=api,
    )
    worked, session = fields.get("worked") is True, fields.get("session") is True
    reported = None
    if worked or session or signals.login is not None:
        reported = Reported(worked, signals.login, session)
    return RecordedEnd(outcome, None if usage.empty else usage, limit, reported)


_NONE: Final[tuple[None, None, tuple[ModelUsage, ...], None, None]] = (None, None, (), None, None)


_CLASSES: Final = {failure.value: failure for failure in Failure}


def _failure(where: str, name: object) -> Failure | None:
    if name is None:
        return None
    failure = _CLASSES.get(name) if isinstance(name, str) else None
    if failure is None:
        known = ", ".join(_CLASSES)
        raise TraceFormatError(f"{where}: failure: expected one of {known}, got {name!r}")
    return failure


def _spend(
    where: str, spend: object
) -> tuple[Tokens | None, float | None, tuple[ModelUsage, ...], int | None, float | None]:
    """A finish's ``spend`` (``spend_json``'s form) as the stream's figures."""
    if not isinstance(spend, Mapping):
        raise TraceFormatError(f"{where}: spend: expected an object, got {spend!r}")
    tokens = _tokens(f"{where}: spend.tokens", spend.get("tokens"))
    models = spend.get("models") or []
    if not isinstance(models, list):
        raise TraceFormatError(f"{where}: spend.models: expected a list, got {models!r}")
    read: list[ModelUsage] = []
    for n, model in enumerate(models):
        if not isinstance(model, Mapping) or not isinstance(model.get("model"), str):
            raise TraceFormatError(f"{where}: spend.models[{n}]: expected {{model, tokens}}")
        counted = _tokens(f"{where}: spend.models[{n}].tokens", model.get("tokens"))
        read.append(
            ModelUsage(
                model["model"],
                counted or Tokens(),
                _amount(f"{where}: spend.models[{n}].cost_usd", model.get("cost_usd")),
            )
        )
    turns = spend.get("turns")
    if turns is not None and count(turns) is None:
        raise TraceFormatError(f"{where}: spend.turns: expected a whole number >= 0, got {turns!r}")
    api_time = _amount(f"{where}: spend.api_time", spend.get("api_time"))
    cost = _amount(f"{where}: spend.cost_usd", spend.get("cost_usd"))
    return tokens, cost, tuple(read), count(turns), api_time


def _tokens(where: str, value: object) -> Tokens | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TraceFormatError(f"{where}: expected an object of counts by kind, got {value!r}")
    counts: dict[str, int] = {}
    for kind in ("input", "cache_read", "cache_write", "output", "reasoning"):
        amount = count(value.get(kind, 0))
        if amount is None:
            raise TraceFormatError(
                f"{where}.{kind}: expected a whole number >= 0, got {value.get(kind)!r}"
            )
        counts[kind] = amount
    return Tokens(**counts)


def _amount(where: str, value: object) -> float | None:
    """A cost or a time: a finite number >= 0, or null."""
    if value is None:
        return None
    amount = usd(value)
    if amount is None:
        raise TraceFormatError(f"{where}: expected a number >= 0, got {value!r}")
    return amount
