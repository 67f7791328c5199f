"""Both engines carry a synthetic run's spend and failure class to the trace and the figures."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from sim_workloads import config_json

from herdsman.sim.engine import FastEngine, fast_replay
from herdsman.sim.generate import Samples, generate
from herdsman.sim.metrics import figures, measure
from herdsman.sim.model import Arrivals, Durations, Model, PerKind, TokenModel
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload_text
from herdsman.trace import read_trace_text


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def spent_workload(seed: int = 5) -> str:
    spends = TokenModel(PerKind(input=20_000, cache_read=300_000, output=6_000), 0.5)
    model = Model(
        span=3 * 3600.0,
        arrivals=Arrivals("poisson", rate=20.0),
        durations=Durations("lognormal", mean=240.0, sigma=0.9),
        providers=(("claude", 2.0), ("codex", 1.0)),
        turns=2.0,
        think=120.0,
        outcomes=(("failed", 0.05),),
        usage_limited=(("claude", 0.1),),
        tokens=(("claude", spends), ("codex", TokenModel(PerKind(output=9_000)))),
        prices=(("claude", PerKind(input=3, cache_read=0.3, output=15)),),
        failures=tuple((name, 0.04) for name in ("overloaded", "idle_timeout", "crash")),
    )
    return generate(model, config_json(), seed, Samples())


def finishes(trace: str) -> list[dict[str, Any]]:
    return [dict(e.fields) for e in read_trace_text(trace, "t")[1] if e.event == "finish"]


def test_the_engines_trace_the_same_spends_and_failure_endings() -> None:
    text = spent_workload()
    workload = read_workload_text(text, "spent")
    loaded = config_from_trace(workload.header.config, "spent")
    trio, fast = replay(workload, loaded), fast_replay(workload, loaded)
    assert fast.trace == trio.trace  # the real supervisor's records, byte for byte
    ended = {f["run_id"]: f for f in finishes(fast.trace) if not f.get("requeued")}
    retried = {
        e.fields["run_id"] for e in read_trace_text(fast.trace, "t")[1] if e.event == "retry"
    }
    submitted = {e.fields["run"]["id"]: e.fields for e in read_trace_text(text, "w")[1]}
    failures = {run: s["failure"] for run, s in submitted.items() if "failure" in s}
    assert set(failures.values()) == {"overloaded", "idle_timeout", "crash"}
    for run_id, failure in failures.items():
        # The failing attempt ends as the runner reports it: failed (a signal's
        # exit for a crash), or timed out by the runner for a silent agent; the
        # provider's retry policy (overloaded only) tries it again, as
        # production's failure_of classes it, and its next attempt succeeds.
        expected = {
            "overloaded": ("failed", 1),
            "idle_timeout": ("timed_out", -15),
            "crash": ("failed", -11),
        }[failure]
        first = next(f for f in finishes(fast.trace) if f["run_id"] == run_id)
        assert (first["outcome"], first["exit_code"]) == expected
        assert first.get("requeued", False) is (failure == "overloaded")
        assert (run_id in retried) is (failure == "overloaded")
        if failure == "overloaded" and run_id in ended:
            assert ended[run_id]["outcome"] == "succeeded"
    spent = [f for f in ended.values() if "spend" in f]
    assert spent
    for finish in spent:
        wrote = submitted[finish["run_id"]]["spend"]
        tokens = finish["spend"]["tokens"]
        assert {k: v for k, v in tokens.items() if k in wrote["tokens"]} == wrote["tokens"]
        assert tokens["total"] == sum(wrote["tokens"].values())
        assert finish["spend"]["cost_usd"] == wrote.get("cost_usd")


def test_a_usage_limited_runs_spend_goes_with_the_attempt_that_does_its_work() -> None:
    text = spent_workload()
    limited = [
        e.fields for e in read_trace_text(text, "w")[1] if e.fields["outcome"] == "usage_limited"
    ]
    assert limited
    workload = read_workload_text(text, "spent")
    trace = fast_replay(workload, config_from_trace(workload.header.config, "spent")).trace
    for submit in limited:
        run_id = submit["run"]["id"]
        ends = [f for f in finishes(trace) if f["run_id"] == run_id]
        requeued = [f for f in ends if f.get("requeued")]
        assert requeued
        assert all("spend" not in f for f in requeued)
        if ends[-1].get("requeued"):
            continue  # never ran again in the recording's time
        assert ends[-1]["outcome"] == "succeeded"
        assert ends[-1]["spend"]["tokens"]["total"] == sum(submit["spend"]["tokens"].values())


def test_the_plan_engine_adds_up_the_spend_its_trace_says() -> None:
    workload = read_workload_text(spent_workload(6), "spent")
    loaded = config_from_trace(workload.header.config, "spent")
    traced = FastEngine(workload, loaded, metrics=True)
    traced.run()
    figures = traced.metrics()
    assert figures == measure(traced.text)
    ended = [f for f in finishes(traced.text) if not f.get("requeued")]
    # Every attempt's spend counts, a retried one's too (it is what the agents burned).
    every = finishes(traced.text)
    assert any("spend" in f for f in every if f.get("requeued"))
    tokens = sum(f["spend"]["tokens"]["total"] for f in every if "spend" in f)
    usd = sum(f["spend"]["cost_usd"] or 0 for f in every if "spend" in f)
    end = max(e.t for e in read_trace_text(traced.text, "t")[1])
    assert tokens > 0
    assert usd > 0
    assert end < 86400  # a workload shorter than a day spends its all in its day
    assert figures.tokens_per_day == pytest.approx(tokens)
    assert figures.spend_per_day == pytest.approx(usd)
    assert figures.tokens_per_run == pytest.approx(tokens / len(ended))
    assert figures.spend_per_run == pytest.approx(usd / len(ended))


def test_a_workload_without_spend_measures_none() -> None:
    text = spent_workload()
    plain_lines = []
    for raw in text.splitlines():
        event = json.loads(raw)
        event.pop("spend", None)
        plain_lines.append(json.dumps(event, separators=(",", ":")))
    workload = read_workload_text("\n".join(plain_lines) + "\n", "plain")
    loaded = config_from_trace(workload.header.config, "plain")
    engine = FastEngine(workload, loaded, metrics=True)
    engine.run()
    figures = engine.metrics()
    assert '"spend"' not in engine.text
    assert (figures.tokens_per_day, figures.spend_per_day) == (0.0, 0.0)
    assert figures == measure(engine.text)


@pytest.mark.parametrize(
    ("end", "per_day"),
    [(3 * 86400.0, 2.0), (86400.0, 6.0), (8 * 3600.0, 6.0), (0.0, 6.0)],
)
def test_spend_per_day_is_over_the_simulated_days_but_at_least_one(
    end: float, per_day: float
) -> None:
    counted = figures(
        [],
        busy=0.0,
        end=end,
        slots=1,
        ended=4,
        usage_limited=0,
        timeouts=0,
        unstarted=0,
        tokens=300,
        usd=6.0,
    )
    assert counted.spend_per_day == pytest.approx(per_day)
    assert counted.tokens_per_day == pytest.approx(per_day * 50)
    assert (counted.spend_per_run, counted.tokens_per_run) == (1.5, 75.0)
