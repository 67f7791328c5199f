"""A retried synthetic run spends on every attempt, as a recorded one's finishes say it did."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from sim_workloads import config_json

from herdsman.sim.engine import FastEngine, fast_replay
from herdsman.sim.generate import Samples, generate
from herdsman.sim.model import Arrivals, Durations, Model, PerKind, TokenModel
from herdsman.sim.replay import replay
from herdsman.sim.workload import Workload, config_from_trace, read_workload_text
from herdsman.trace import read_trace_text

#: Turns the default policy's retries (overloaded among its classes) off.
NO_RETRIES = "providers.claude.retry.attempts=1"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def failing_workload(seed: int, span: float = 3 * 3600.0, share: float = 0.1) -> str:
    """Claude runs with a spend model, ``share`` of them overloaded (which the policy retries)."""
    model = Model(
        span=span,
        arrivals=Arrivals("poisson", rate=20.0),
        durations=Durations("lognormal", mean=240.0, sigma=0.9),
        providers=(("claude", 1.0),),
        tokens=(("claude", TokenModel(PerKind(input=20_000, output=6_000), 0.5)),),
        prices=(("claude", PerKind(input=3, output=15)),),
        failures=(("overloaded", share),),
    )
    return generate(model, config_json(), seed, Samples())


def lines(text: str) -> dict[str, dict[str, Any]]:
    """Each run's submit line, by run id."""
    return {e.fields["run"]["id"]: dict(e.fields) for e in read_trace_text(text, "w")[1]}


def events(trace: str, kind: str) -> list[dict[str, Any]]:
    return [dict(e.fields) for e in read_trace_text(trace, "t")[1] if e.event == kind]


def planned(workload: Workload, *sets: str) -> FastEngine:
    loaded = config_from_trace(workload.header.config, "w", sets)
    engine = FastEngine(workload, loaded, metrics=True)
    engine.run()
    return engine


@pytest.mark.parametrize("seed", [1, 2])
def test_retries_add_each_failed_attempts_spend_to_the_days(seed: int) -> None:
    text = failing_workload(seed)
    workload = read_workload_text(text, "w")
    retrying, once = planned(workload), planned(workload, NO_RETRIES)
    assert not events(once.text, "retry")
    retried = sorted({r["run_id"] for r in events(retrying.text, "retry")})
    assert retried  # the seed draws failures the policy retries
    submitted = lines(text)
    # Runs end alike either way (all within the day): retrying only adds
    # the spend of each retried run's attempt that does the work.
    extra_usd = math.fsum(submitted[run]["spend"]["cost_usd"] for run in retried)
    extra_tokens = sum(sum(submitted[run]["spend"]["tokens"].values()) for run in retried)
    with_retries, without = retrying.metrics(), once.metrics()
    assert with_retries.spend_per_day > without.spend_per_day
    assert with_retries.spend_per_day == pytest.approx(without.spend_per_day + extra_usd)
    assert with_retries.tokens_per_day == pytest.approx(without.tokens_per_day + extra_tokens)


def test_each_attempt_of_a_retried_run_finishes_with_the_lines_spend() -> None:
    text = failing_workload(3, span=3600.0, share=0.3)
    workload = read_workload_text(text, "w")
    loaded = config_from_trace(workload.header.config, "w")
    trio, fast = replay(workload, loaded), fast_replay(workload, loaded)
    assert fast.trace == trio.trace
    retried = {r["run_id"] for r in events(fast.trace, "retry")}
    assert retried
    submitted = lines(text)
    for run_id in sorted(retried):
        ends = [f for f in events(fast.trace, "finish") if f["run_id"] == run_id]
        assert [f.get("requeued", False) for f in ends] == [True, False]
        assert [(f["outcome"], f.get("failure")) for f in ends] == [
            ("failed", "overloaded"),
            ("succeeded", None),
        ]
        wrote = submitted[run_id]["spend"]
        for finish in ends:
            spend = finish["spend"]
            assert spend["tokens"]["total"] == sum(wrote["tokens"].values())
            assert spend["cost_usd"] == wrote["cost_usd"]


def test_a_run_moved_off_a_refused_account_spends_only_where_it_does_its_work() -> None:
    model = Model(
        span=3600.0,
        arrivals=Arrivals("poisson", rate=10.0),
        durations=Durations("lognormal", mean=240.0, sigma=0.9),
        providers=(("claude", 1.0),),
        tokens=(("claude", TokenModel(PerKind(input=20_000, output=6_000), 0.5)),),
        failures=(("authentication_failed", 0.1),),
    )
    text = generate(model, config_json(), 3, Samples())
    workload = read_workload_text(text, "w")
    trace = fast_replay(workload, config_from_trace(workload.header.config, "w")).trace
    refused = sorted({r["run_id"] for r in events(trace, "needs_login")})
    submitted = lines(text)
    moved = 0
    for run_id in refused:
        ends = [f for f in events(trace, "finish") if f["run_id"] == run_id]
        tokens = sum(submitted[run_id]["spend"]["tokens"].values())
        assert ends[0]["requeued"] is True
        assert "spend" not in ends[0]  # refused before it did any work: it spent nothing
        if len(ends) > 1:  # the other account took it (else it waits for a login)
            moved += 1
            last = ends[-1]
            assert last["outcome"] == "succeeded"
            assert "spend" in last
            assert last["spend"]["tokens"]["total"] == tokens
    assert moved
