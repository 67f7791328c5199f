"""What a synthetic run spends, and how a run failing of a class ends, as a workload says it.

A generated workload's submit line may carry, beside ``duration`` and
``outcome`` (docs/simulator.md, "Spend and failures"):

* ``spend``: ``{"tokens": {"input": N, "cache_read": N, "cache_write": N,
  "output": N}, "cost_usd": X}`` — what the run's agent spends (tokens by
  kind; a kind left out is 0; ``cost_usd`` may be left out or ``null``: the
  stream stated none);
* ``failure``: the class of the failure the run ends with, one of
  :data:`FAILURE_CLASSES`; its ``outcome`` must be the one the class ends
  a run with today (:data:`ENDINGS`).

Both are read into the :class:`~herdsman.runtime.runner.run_usage.RunUsage`
a real run's agent stream gives the runner, so the simulated supervisor
records them through the production path (``spend_of``), and the fast
engine traces and measures exactly what that path records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import attrs

from herdsman.runtime.runner.api_failure import ApiFailure
from herdsman.runtime.runner.run_usage import RunUsage, Tokens
from herdsman.trace import TraceFormatError

__all__ = ["ENDINGS", "FAILURE_CLASSES", "TOKEN_KINDS", "Ending", "read_failure", "read_spend"]

#: Token kinds a synthetic run spends (Tokens' fields; ``reasoning`` is part of output).
TOKEN_KINDS: Final = ("input", "cache_read", "cache_write", "output")


@attrs.frozen
class Ending:
    """How the runner reports a run that fails of a class: what the lifecycle is handed.

    ``outcome`` and ``exit_code`` as the runner reports them; ``api_failure``
    the class the agent's stream names (None when the stream names none);
    ``limit`` the limit that fired, for a timed-out run.
    """

    outcome: str
    exit_code: int
    api_failure: ApiFailure | None = None
    limit: str | None = None


#: Each failure class and how a run of it ends today. The API classes are
#: what the agent's stream names (it exits 1, the failure in its stream);
#: ``idle_timeout`` is the runner stopping a silent agent (SIGTERM to its
#: group, ``timed_out``); ``crash`` an agent killed by a signal (SIGSEGV)
#: with nothing in its stream.
ENDINGS: Final[Mapping[str, Ending]] = {
    "overloaded": Ending("failed", 1, ApiFailure.OVERLOADED),
    "server_error": Ending("failed", 1, ApiFailure.SERVER_ERROR),
    "rate_limit": Ending("failed", 1, ApiFailure.RATE_LIMIT),
    "connection": Ending("failed", 1, ApiFailure.CONNECTION),
    "idle_timeout": Ending("timed_out", -15, limit="idle_timeout"),
    "crash": Ending("failed", -11),
    "authentication_failed": Ending("failed", 1, ApiFailure.AUTHENTICATION),
}

#: The failure classes a workload may name, in the order docs list them.
FAILURE_CLASSES: Final = tuple(ENDINGS)


def read_failure(where: str, fields: Mapping[str, Any], outcome: str) -> Ending | None:
    """The ending of a submit line's ``failure`` (None without one); checked against ``outcome``."""
    name = fields.get("failure")
    if name is None:
        return None
    ending = ENDINGS.get(name) if isinstance(name, str) else None
    if ending is None:
        raise TraceFormatError(
            f"{where}: failure: expected one of {', '.join(FAILURE_CLASSES)}, got {name!r}"
        )
    if outcome != ending.outcome:
        raise TraceFormatError(
            f"{where}: failure {name} ends a run {ending.outcome}, but outcome is {outcome!r}"
            f' (write "outcome":"{ending.outcome}")'
        )
    return ending


def read_spend(where: str, value: Any) -> tuple[Tokens | None, float | None]:
    """A submit line's ``spend``: its tokens and cost; :class:`TraceFormatError` if malformed."""
    if not isinstance(value, Mapping):
        raise TraceFormatError(
            f"{where}: spend: expected an object such as"
            f' {{"tokens": {{"input": 1200, "output": 300}}, "cost_usd": 0.01}}, got {value!r}'
        )
    unknown = sorted(set(value) - {"tokens", "cost_usd"})
    if unknown:
        raise TraceFormatError(
            f"{where}: spend: unknown key {unknown[0]!r}; expected tokens and cost_usd"
        )
    tokens = value.get("tokens")
    if tokens is not None:
        if not isinstance(tokens, Mapping):
            raise TraceFormatError(
                f"{where}: spend.tokens: expected an object of counts by kind, got {tokens!r}"
            )
        counts: dict[str, int] = {}
        for kind, count in tokens.items():
            if kind not in TOKEN_KINDS:
                raise TraceFormatError(
                    f"{where}: spend.tokens: unknown kind {kind!r}; expected"
                    f" {', '.join(TOKEN_KINDS)}"
                )
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise TraceFormatError(
                    f"{where}: spend.tokens.{kind}: expected a whole number >= 0, got {count!r}"
                )
            counts[kind] = count
        tokens = Tokens(**counts)
    cost = value.get("cost_usd")
    if cost is not None and (
        not isinstance(cost, int | float)
        or isinstance(cost, bool)
        or not math.isfinite(cost)
        or cost < 0
    ):
        raise TraceFormatError(f"{where}: spend.cost_usd: expected dollars >= 0, got {cost!r}")
    return tokens, None if cost is None else float(cost)


def usage_of(where: str, fields: Mapping[str, Any], ending: Ending | None) -> RunUsage | None:
    """What the agent's stream of a synthetic run says: its spend and failure class, if any."""
    spend = fields.get("spend")
    tokens, cost = (None, None) if spend is None else read_spend(where, spend)
    failure = None if ending is None else ending.api_failure
    if spend is None and failure is None:
        return None
    return RunUsage(tokens=tokens, cost_usd=cost, failure=failure)
