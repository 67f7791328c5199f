"""What agents' streams say, and the policies and budgets that act on it, in a fuzz scenario.

A seed's scenario (``herdsman.sim.fuzz.scenario``) is dressed here, from a
generator of its own (``Random("agents:SEED")``, and one per run), so every
other draw of a seed is what it was before these faults existed:

* each provider gets the ``protocol`` its name says (``claude``, ``codex``;
  ``local`` is a plain CLI) and, for most seeds, a ``[providers.X.retry]``
  policy: ``attempts``, the classes it retries ``on``, those it retries
  ``after_work``, a ``backoff`` and its cap;
* each named account gets one budget for the whole scenario (every
  configuration a reload writes gives it the same): none, or a ``window``
  with a ``budget`` in ``runs``, ``run_minutes``, ``tokens`` (a provider
  whose stream states them) or ``usd`` (Claude Code's);
* each attempt of a run may say more, in the synthetic workload's words
  (``herdsman.sim.spend``, docs/simulator.md "Spend and failures"):
  ``failure`` (its class: a transient API failure, a refused login, a crash,
  an idle timeout), ``worked`` (the agent called a tool before the attempt
  ended), ``spend`` (tokens by kind, and a cost where the provider's stream
  states one) and ``warning`` (a ``rate_limit_event`` whose status is
  ``allowed_warning``, resetting ``resets_in`` seconds after the attempt
  ends). :func:`attempt_of` reads them into the
  :class:`~herdsman.runtime.runner.run_usage.RunUsage` a real agent's
  stream gives the runner, through the reading the synthetic workloads use.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from herdsman.core.retry import Failure
from herdsman.runtime.runner.run_usage import RateLimitWarning, RunUsage
from herdsman.sim.fuzz.account_checks import AgentEnd
from herdsman.sim.recorded_end import Reported
from herdsman.sim.spend import ENDINGS, read_failure, usage_of
from herdsman.sim.workload import SYNTHETIC_EXIT_CODES, Attempt
from herdsman.trace import TraceFormatError

__all__ = [
    "RETRY_CLASSES",
    "agent_end",
    "attempt_of",
    "attempt_problem",
    "draw_dress",
    "dress_config",
    "dress_submit",
]

#: The classes a retry policy may name.
RETRY_CLASSES: Final = tuple(failure.value for failure in Failure)
#: What an API provider's agent may fail of (its stream names the class).
_API_FAILURES: Final = (
    "overloaded",
    "server_error",
    "rate_limit",
    "connection",
    "crash",
    "authentication_failed",
)
_TRANSIENT: Final = ("overloaded", "server_error", "rate_limit", "connection")
_PROTOCOLS: Final = {"claude": "claude", "codex": "codex"}
_UNITS: Final = {
    "claude": ("runs", "run_minutes", "tokens", "usd"),
    "codex": ("runs", "run_minutes", "tokens"),
}


def draw_dress(seed: int, providers: tuple[str, ...]) -> dict[str, Any]:
    """The seed's retry policies and account budgets, drawn once for all its configurations."""
    rng = random.Random(f"agents:{seed}")
    retry: dict[str, list[str]] = {}
    budgets: dict[str, list[str]] = {}
    for provider in providers:
        if rng.random() < 0.8:
            if rng.random() < 0.6:  # the transient classes, and perhaps more
                on = sorted({*_TRANSIENT, *rng.sample(RETRY_CLASSES, rng.randint(0, 3))})
            else:
                on = sorted(rng.sample(RETRY_CLASSES, rng.randint(0, len(RETRY_CLASSES))))
            after = sorted(c for c in on if rng.random() < 0.3)
            backoff = rng.choice([1, 10, 30])
            retry[provider] = [
                f"[providers.{provider}.retry]",
                f"attempts = {rng.choice([1, 2, 3, 3, 4])}",
                "on = [" + ", ".join(f'"{c}"' for c in on) + "]",
                "after_work = [" + ", ".join(f'"{c}"' for c in after) + "]",
                f'backoff = "{backoff}s"',
                f'backoff_max = "{backoff * rng.choice([1, 2, 4])}s"',
            ]
        units = _UNITS.get(provider, ("runs", "run_minutes"))
        for account in ("a", "b"):
            if rng.random() < 0.4:
                continue
            unit = rng.choice(units)
            budget = {
                "runs": str(rng.randint(1, 4)),
                "run_minutes": str(rng.randint(1, 6)),
                "tokens": str(rng.choice([20_000, 60_000, 150_000])),
                "usd": str(rng.choice([0.1, 0.5, 1.25])),
            }[unit]
            budgets[f"{provider}/{account}"] = [
                f'window = "{rng.choice([60, 300, 900])}s"',
                f"budget = {budget}",
                f'budget_unit = "{unit}"',
            ]
    return {"retry": retry, "budgets": budgets}


_SECTION = re.compile(r"^\[\[?providers\.(\w+)(\.accounts)?\]\]?$")


def dress_config(text: str, dress: Mapping[str, Any]) -> str:
    """``text`` (a drawn configuration) with the seed's protocols, retry policies and budgets.

    The budget lines drawn with the configuration give way to the seed's
    own, so an account's budget is the same in every configuration.
    """
    out: list[str] = []
    provider: str | None = None
    in_account = False
    for line in text.splitlines():
        section = _SECTION.match(line)
        if line.startswith("["):
            if provider is not None and not in_account:
                out += dress["retry"].get(provider, [])
            provider, in_account = None, False
            if section is not None:
                provider, in_account = section.group(1), section.group(2) is not None
        if in_account and line.startswith(("window = ", "budget = ")):
            continue
        out.append(line)
        if section is not None and not in_account and provider in _PROTOCOLS:
            out.append(f'protocol = "{_PROTOCOLS[provider]}"')
        if in_account and provider is not None and line.startswith("name = "):
            name = line.split('"')[1]
            out += dress["budgets"].get(f"{provider}/{name}", [])
    if provider is not None and not in_account:
        out += dress["retry"].get(provider, [])
    return "\n".join(out) + "\n"


def dress_submit(seed: int, event: Mapping[str, Any]) -> dict[str, Any]:
    """A submit whose attempts say what its agent's stream says: the same for the same run."""
    run = event["run"]
    rng = random.Random(f"agents:{seed}:{run['id']}")
    provider = run["provider"]
    attempts = []
    for drawn in event["attempts"]:
        attempt = dict(drawn)
        outcome = attempt["outcome"]
        if outcome == "succeeded" and provider != "local" and rng.random() < 0.25:
            outcome = attempt["outcome"] = "failed"
            attempt["failure"] = rng.choice((*_TRANSIENT, "authentication_failed"))
        elif outcome == "failed":
            attempt["failure"] = rng.choice(_API_FAILURES) if provider != "local" else "crash"
        elif outcome == "timed_out":
            attempt["failure"] = "idle_timeout"
        if "failure" in attempt:
            attempt["exit_code"] = ENDINGS[attempt["failure"]].exit_code
            attempt["worked"] = rng.random() < 0.5
        if provider != "local" and outcome != "usage_limited":
            tokens = {
                "input": rng.randint(0, 20_000),
                "cache_read": rng.randint(0, 100_000),
                "cache_write": rng.randint(0, 5_000),
                "output": rng.randint(0, 8_000),
            }
            spend: dict[str, Any] = {"tokens": tokens}
            if provider == "claude":
                spend["cost_usd"] = round(rng.uniform(0.0, 0.4), 6)
            attempt["spend"] = spend
        if provider == "claude" and rng.random() < 0.2:
            attempt["warning"] = {"resets_in": float(rng.choice([30, 300, 3600]))}
        attempts.append(attempt)
    if "failure" in attempts[-1] and rng.random() < 0.6:
        # Something for a retry to run: the next attempt does the work.
        attempts.append({"duration": float(rng.choice([5, 30])), "outcome": "succeeded"})
    return {**event, "attempts": attempts}


def attempt_problem(attempt: Mapping[str, Any]) -> str | None:
    """What is wrong with one attempt's agent fields (a case file's), if anything."""
    try:
        read_failure("", attempt, attempt["outcome"])
        usage_of("", attempt, None)
    except TraceFormatError as error:
        return str(error).removeprefix(": ")
    if not isinstance(attempt.get("worked", False), bool):
        return "worked: expected true or false"
    warning = attempt.get("warning")
    if warning is not None and not (
        isinstance(warning, dict)
        and isinstance(warning.get("resets_in"), int | float)
        and not isinstance(warning["resets_in"], bool)
        and warning["resets_in"] >= 0
    ):
        return 'warning: expected {"resets_in": seconds >= 0}'
    return None


def attempt_of(attempt: Mapping[str, Any]) -> Attempt:
    """The workload's attempt for one attempt of a scenario's submit.

    What its agent's stream says (spend, failure class, a warning) is the
    ``RunUsage`` the runner would hand on; a warning's reset is put on when
    the attempt ends (``herdsman.sim.fuzz.stand_ins``).
    """
    outcome = attempt["outcome"]
    ending = read_failure("fuzz", attempt, outcome)
    usage = usage_of("fuzz", attempt, ending)
    if "warning" in attempt:
        # Its reset is put on at the attempt's end (the stand-in runner's).
        near = RateLimitWarning(resets_at=None, limit_type="five_hour", utilization=0.9)
        usage = _near_limit(usage, near)
    exit_code = attempt.get(
        "exit_code", SYNTHETIC_EXIT_CODES[outcome] if ending is None else ending.exit_code
    )
    limit = None if ending is None else ending.limit
    return Attempt(
        float(attempt["duration"]),
        outcome,
        exit_code,
        usage=usage,
        limit=limit,
        reported=Reported(worked=True) if attempt.get("worked", False) else None,
    )


def _near_limit(usage: RunUsage | None, near: RateLimitWarning) -> RunUsage:
    """``usage`` (or nothing) with the provider's warning that the account is near its limit."""
    return attrs.evolve(usage or RunUsage(), near_limit=near)


def agent_end(attempt: Mapping[str, Any], *, stopped: bool) -> AgentEnd:
    """How ``attempt`` (a scenario's; empty: one past its list, which succeeds) ended,
    as the checker takes it: nothing said if the supervisor ``stopped`` it first."""
    if stopped:
        return AgentEnd(None)
    spend = attempt.get("spend") or {}
    tokens = spend.get("tokens")
    budgeted = None
    if tokens is not None:
        # Tokens a budget counts: cache reads left out (docs/accounts.md).
        budgeted = sum(tokens.get(kind, 0) for kind in ("input", "cache_write", "output"))
    limited = attempt.get("outcome") == "usage_limited"
    return AgentEnd(
        attempt.get("failure"),
        worked=bool(attempt.get("worked", False)),
        tokens=budgeted,
        usd=spend.get("cost_usd"),
        limited=limited,
    )
