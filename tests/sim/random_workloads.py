"""Hypothesis strategies for random workloads both simulation engines must agree on.

Times, durations and windows sit on a grid of quarter seconds from a whole
start time, so every sum is exact in floating point: the engines are
compared on their decisions, never on how they round.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from herdsman.config import LoadedConfig, load_config_text
from herdsman.config.report import config_as_json
from herdsman.runtime.runner.api_failure import ApiFailure
from herdsman.runtime.runner.run_usage import RateLimitWarning, RunUsage, Tokens
from herdsman.sim.workload import Arrival, Attempt, RunPlan, Workload, config_from_trace
from herdsman.trace import TraceHeader, format_time

STARTED_AT = 1_795_000_000.0  # a whole second: sums with the grid stay exact
PROVIDERS = ("claude", "codex", "local")
#: The budget units a provider's stream lets it use besides runs and run minutes.
SPEND_UNITS = {"claude": ("tokens", "usd"), "codex": ("tokens",)}
OUTCOMES = ("succeeded",) * 5 + ("failed", "timed_out", "usage_limited", "usage_limited")

# Mostly whole seconds, so ends, arrivals and rests ending often fall on one
# instant: the order of events at one moment is what is hardest to get right.
quarter = st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.0, 2.0, 2.0, 3.0, 4.0])


@st.composite
def accounts(draw: st.DrawFn, provider: str) -> list[str]:
    """TOML for zero to two accounts of ``provider``, with caps, windows and budgets."""
    out = []
    for name in draw(st.sampled_from([[], ["a"], ["a", "b"], ["b"]])):
        lines = [f"[[providers.{provider}.accounts]]", f'name = "{name}"']
        if draw(st.booleans()):
            lines.append(f"concurrency = {draw(st.integers(1, 2))}")
        if draw(st.booleans()):
            lines.append(f'window = "{draw(st.sampled_from([4, 10, 30]))}s"')
            # Only a stream that states spend may be budgeted by it (claude: tokens
            # and dollars; codex: tokens).
            units = ["runs", "run_minutes", *SPEND_UNITS.get(provider, ())]
            unit = draw(st.sampled_from(units))
            # Budgets on the scale of what usages() spends: a few runs' worth.
            budget = {
                "runs": st.integers(1, 4),
                "run_minutes": st.integers(1, 4),
                "tokens": st.sampled_from([1, 500_000, 2_000_000]),
                "usd": st.sampled_from([0.01, 1, 3]),
            }[unit]
            lines.append(f"budget = {draw(budget)}")
            lines.append(f'budget_unit = "{unit}"')
        out.append("\n".join(lines))
    return out


@st.composite
def configs(draw: st.DrawFn) -> str:
    """A supervisor.toml with one to three providers, caps, accounts and a grace."""
    cap = draw(st.one_of(st.none(), st.integers(1, 4)))
    grace = draw(st.sampled_from(["1s", "3s", "10m"]))
    lines = ["[supervisor]", 'state_dir = "/sim/state"', f'shutdown_grace = "{grace}"']
    if cap is not None:
        lines.append(f"max_concurrency = {cap}")
    lines += ["[scheduling]", f"agent_exclusive = {str(draw(st.booleans())).lower()}"]
    chosen = draw(st.lists(st.sampled_from(PROVIDERS), min_size=1, max_size=3, unique=True))
    for provider in chosen:
        lines += [
            f"[providers.{provider}]",
            f'exec = ["{provider}"]',
            f"concurrency = {draw(st.integers(1, 3))}",
        ]
        if provider in SPEND_UNITS:
            lines.append(f'protocol = "{provider}"')
        if draw(st.booleans()):
            # A retry policy: the classes usages() fails with, before and after work.
            classes = ["overloaded", "rate_limit", "server_error", "connection"]
            on = draw(st.lists(st.sampled_from(classes), unique=True))
            after = draw(st.lists(st.sampled_from(on), unique=True)) if on else []
            lines += [
                f"[providers.{provider}.retry]",
                f"attempts = {draw(st.integers(1, 3))}",
                "on = [" + ", ".join(f'"{c}"' for c in on) + "]",
                "after_work = [" + ", ".join(f'"{c}"' for c in after) + "]",
                f'backoff = "{draw(st.sampled_from([1, 2, 4]))}s"',
                'backoff_max = "8s"',
            ]
        lines += draw(accounts(provider))
    return "\n".join(lines) + "\n"


def loaded_from(text: str) -> LoadedConfig:
    """A configuration as a trace carries it (made from its JSON, as a replay makes it)."""
    loaded = load_config_text(text, Path("/sim/supervisor.toml"), environ={})
    return config_from_trace(config_as_json(loaded.config), "generated")


@st.composite
def attempts(draw: st.DrawFn, at: float) -> Attempt:
    """One attempt: a duration, an outcome, an exit code (None: never spawned)."""
    outcome = draw(st.sampled_from(OUTCOMES))
    duration = draw(quarter)
    exit_code = draw(st.sampled_from([0, 1, None]))
    resets_at = None
    if outcome == "usage_limited" and draw(st.booleans()):
        # A reset the provider named: ahead of the limit, or already past.
        resets_at = STARTED_AT + at + draw(st.sampled_from([-1.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0]))
    # What the agent's stream said: a generated run's spend and failure class.
    limit = "idle_timeout" if outcome == "timed_out" and draw(st.booleans()) else None
    return Attempt(duration, outcome, exit_code, resets_at, usage=draw(usages()), limit=limit)


@st.composite
def usages(draw: st.DrawFn) -> RunUsage | None:
    """A synthetic run's spend and failure class, or nothing said."""
    if draw(st.booleans()):
        return None
    tokens = draw(
        st.one_of(
            st.none(),
            st.builds(Tokens, input=st.integers(0, 10**6), output=st.integers(0, 10**5)),
        )
    )
    cost = draw(st.sampled_from([None, 0.0, 0.015, 1.25]))
    failure = draw(
        st.sampled_from(
            [
                None,
                ApiFailure.OVERLOADED,
                ApiFailure.RATE_LIMIT,
                ApiFailure.SERVER_ERROR,
                ApiFailure.CONNECTION,
                ApiFailure.AUTHENTICATION,  # a refused login: the run moves
            ]
        )
    )
    near = None
    if draw(st.booleans()):
        # The provider warned the account is near its limit: until a reset, or its window.
        resets = draw(st.sampled_from([None, 2.0, 5.0, 12.0]))
        near = RateLimitWarning(None if resets is None else STARTED_AT + resets, "five_hour")
    return RunUsage(tokens=tokens, cost_usd=cost, failure=failure, near_limit=near)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Workload, LoadedConfig]:
    """A workload (submits, skips, cancels, reloads, maybe shutdowns) and its configuration."""
    first = draw(configs())
    others = [draw(configs()) for _ in range(draw(st.integers(0, 2)))]
    arrivals: list[Arrival] = []
    plans: dict[str, RunPlan] = {}
    ids: list[str] = []
    t = 0.0
    for _ in range(draw(st.integers(1, 24))):
        t += draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.0, 2.0]))
        what = draw(st.sampled_from(["submit"] * 6 + ["skip", "cancel", "again", "reload"]))
        if what == "cancel" and ids:
            arrivals.append(Arrival(t, "cancel", {"run_id": draw(st.sampled_from(ids))}))
        elif what == "reload" and others:
            config = config_as_json(loaded_from(draw(st.sampled_from([first, *others]))).config)
            arrivals.append(Arrival(t, "reload", {"generation": 0, "config": config}))
        elif what == "again" and ids:
            # A repeated id: the ledger answers with the run it already was.
            arrivals.append(Arrival(t, "submit", {"run": {"id": ids[0], "provider": "claude"}}))
        else:
            run_id = f"r{len(ids)}"
            ids.append(run_id)
            run: dict[str, Any] = {
                "id": run_id,
                "provider": draw(st.sampled_from(PROVIDERS)),
                "workspace": draw(st.sampled_from(["default", "default", "w2"])),
            }
            conversation = draw(st.sampled_from([None, "c1", "c2", "c3"]))
            if conversation is not None:
                run["conversation"] = conversation
            agent = draw(st.sampled_from([None, None, "a1", "a2"]))
            if agent is not None:
                run["agent"] = agent
            cwd = draw(st.sampled_from([None, None, None, "/r", "/r/x", "/r/y"]))
            if cwd is not None:
                run["cwd"] = cwd
            tries = [draw(attempts(t)) for _ in range(draw(st.integers(0, 2)))]
            synthetic = draw(st.booleans())
            usage = draw(usages()) if synthetic else None
            plans[run_id] = RunPlan(len(plans), tries, synthetic=synthetic, usage=usage)
            arrivals.append(Arrival(t, "skip" if what == "skip" else "submit", {"run": run}))
    for _ in range(draw(st.integers(0, 2)) if draw(st.booleans()) else 0):
        # A drain, then perhaps a forced stop; whatever comes after is refused.
        t += draw(quarter)
        arrivals.append(Arrival(t, "shutdown", {}))
    loaded = loaded_from(first)
    started = format_time(dt.datetime.fromtimestamp(STARTED_AT, dt.UTC))
    header = TraceHeader(1, started, config_as_json(loaded.config), None)
    return Workload(header, STARTED_AT, tuple(arrivals), plans), loaded
