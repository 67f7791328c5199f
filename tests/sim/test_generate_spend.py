"""``sim generate``'s spend model: tokens per run, prices, failure classes, their checks."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_workloads import CONFIG, config_json

from herdsman.cli import main
from herdsman.sim.generate import Samples, generate
from herdsman.sim.model import (
    Arrivals,
    Durations,
    Model,
    ModelError,
    PerKind,
    TokenModel,
    model_from_json,
    model_to_json,
)
from herdsman.sim.spend import ENDINGS, FAILURE_CLASSES
from herdsman.sim.workload import read_workload_text
from herdsman.trace import TraceFormatError, read_trace_text

CLAUDE_TOKENS = TokenModel(PerKind(input=20_000, cache_read=400_000, output=8_000))
CLAUDE_PRICES = PerKind(input=3, cache_read=0.3, cache_write=3.75, output=15)


def model(**changes: Any) -> Model:
    base: dict[str, Any] = {
        "span": 20 * 3600.0,
        "arrivals": Arrivals("poisson", rate=30.0),
        "durations": Durations("lognormal", mean=300.0, sigma=0.8),
        "providers": (("claude", 1.0), ("codex", 1.0)),
    }
    base.update(changes)
    return Model(**base)


def submits(text: str) -> list[dict[str, Any]]:
    _, events = read_trace_text(text, "generated")
    return [dict(e.fields) for e in events]


def test_a_run_spends_its_kinds_means_in_proportion_to_its_duration() -> None:
    text = generate(
        model(tokens=(("claude", CLAUDE_TOKENS),), prices=(("claude", CLAUDE_PRICES),)),
        config_json(),
        1,
        Samples(),
    )
    runs = submits(text)
    claude = [run for run in runs if run["run"]["provider"] == "claude"]
    assert claude
    assert len(claude) < len(runs)
    # A provider without --tokens says nothing of what it spent.
    assert all("spend" not in run for run in runs if run["run"]["provider"] == "codex")
    for run in claude:
        tokens = run["spend"]["tokens"]
        assert set(tokens) == {"input", "cache_read", "output"}  # kinds with a mean only
        scale = run["duration"] / 300.0  # sigma 0: exactly in proportion
        assert tokens["input"] == round(20_000 * scale)
        assert tokens["cache_read"] == round(400_000 * scale)
        assert tokens["output"] == round(8_000 * scale)
        priced = (tokens["input"] * 3 + tokens["cache_read"] * 0.3 + tokens["output"] * 15) / 1e6
        assert run["spend"]["cost_usd"] == pytest.approx(priced, abs=1e-6)
    # Over many runs the mean per run is the mean given.
    mean = sum(run["spend"]["tokens"]["input"] for run in claude) / len(claude)
    assert mean == pytest.approx(20_000, rel=0.1)


def test_the_noise_spreads_tokens_around_the_duration_line_with_mean_one() -> None:
    noisy = TokenModel(PerKind(output=10_000), sigma=0.7)
    runs = submits(generate(model(tokens=(("claude", noisy),)), config_json(), 2, Samples()))
    ratios = [
        run["spend"]["tokens"]["output"] / (10_000 * run["duration"] / 300.0)
        for run in runs
        if "spend" in run and run["duration"] > 1
    ]
    assert len({round(r, 2) for r in ratios}) > len(ratios) // 2  # spread, not a line
    assert sum(ratios) / len(ratios) == pytest.approx(1.0, rel=0.1)
    assert all("cost_usd" not in run["spend"] for run in runs if "spend" in run)  # unpriced


def test_failure_classes_are_shares_of_all_runs_and_end_as_their_class_ends() -> None:
    text = generate(
        model(outcomes=(("failed", 0.2),), failures=(("overloaded", 0.3), ("idle_timeout", 0.2))),
        config_json(),
        3,
        Samples(),
    )
    runs = submits(text)
    shares = {
        name: sum(run.get("failure") == name for run in runs) / len(runs)
        for name in ("overloaded", "idle_timeout")
    }
    assert shares["overloaded"] == pytest.approx(0.3, abs=0.04)
    assert shares["idle_timeout"] == pytest.approx(0.2, abs=0.04)
    plain_failed = sum(run["outcome"] == "failed" and "failure" not in run for run in runs)
    assert plain_failed / len(runs) == pytest.approx(0.2, abs=0.04)
    for run in runs:
        if "failure" in run:
            assert run["outcome"] == ENDINGS[run["failure"]].outcome


def test_a_model_without_spend_draws_and_writes_what_it_did_before() -> None:
    # The failure classes share --outcomes' draw: none given, the same numbers are drawn.
    plain = model(outcomes=(("failed", 0.1),))
    text = generate(plain, config_json(), 4, Samples())
    assert '"spend"' not in text
    assert '"failure"' not in text
    header = json.loads(text.partition("\n")[0])
    assert not {"tokens", "prices", "failures"} & set(header["generator"]["model"])
    with_zero = model(outcomes=(("failed", 0.1),), failures=(("crash", 0.0),))
    body = generate(with_zero, config_json(), 4, Samples()).partition("\n")[2]
    assert body == text.partition("\n")[2]


def test_the_spend_model_survives_the_header() -> None:
    full = model(
        tokens=(("claude", TokenModel(PerKind(input=5, output=7), 0.3)),),
        prices=(("claude", CLAUDE_PRICES),),
        failures=(("rate_limit", 0.1), ("crash", 0.05)),
    )
    again = model_from_json(json.loads(json.dumps(model_to_json(full))), "w:1")
    assert again == full
    broken = model_to_json(full) | {"failures": [["meteor", 0.1]]}
    with pytest.raises(ModelError, match=r"^w:1: generator\.model\.failures: expected shares"):
        model_from_json(broken, "w:1")


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    sigma=st.floats(0, 3),
    means=st.tuples(*(st.integers(0, 10**6) for _ in range(4))).filter(any),
    price=st.floats(0, 100),
    overloaded=st.floats(0, 0.5),
)
def test_generated_spend_is_the_same_for_the_same_seed(
    seed: int, sigma: float, means: tuple[int, int, int, int], price: float, overloaded: float
) -> None:
    spends = TokenModel(PerKind(*map(float, means)), sigma)
    drawn = model(
        span=2 * 3600.0,
        tokens=(("claude", spends), ("codex", spends)),
        prices=(("codex", PerKind(price, price, price, price)),),
        failures=(("overloaded", overloaded),),
    )
    first = generate(drawn, config_json(), seed, Samples())
    assert generate(drawn, config_json(), seed, Samples()) == first
    # And the workload reads back with every spend intact.
    workload = read_workload_text(first, "generated")
    for run in submits(first):
        attempt = workload.plans[run["run"]["id"]].attempts[0]
        assert attempt.usage is not None
        assert attempt.usage.tokens is not None
        assert attempt.usage.tokens.total == sum(run["spend"]["tokens"].values())
        cost = run["spend"].get("cost_usd")
        assert attempt.usage.cost_usd == cost
        assert cost is None or math.isfinite(cost)


def line(**fields: Any) -> str:
    header = {"herdsman_trace": 1, "started_at": "2026-11-30T00:00:00Z", "config": config_json()}
    run = {"id": "r1", "provider": "claude"}
    event = {"t": 0, "seq": 0, "event": "submit", "run": run, **fields}
    return json.dumps(header) + "\n" + json.dumps(event) + "\n"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"spend": 5}, "w:2: spend: expected an object such as"),
        ({"spend": {"tokens": {"input": 1}, "usd": 1}}, "w:2: spend: unknown key 'usd'"),
        ({"spend": {"tokens": {"inputs": 1}}}, "w:2: spend.tokens: unknown kind 'inputs'"),
        ({"spend": {"tokens": {"output": -1}}}, "w:2: spend.tokens.output: expected a whole"),
        ({"spend": {"tokens": {"output": 1.5}}}, "w:2: spend.tokens.output: expected a whole"),
        ({"spend": {"cost_usd": "1"}}, "w:2: spend.cost_usd: expected dollars >= 0"),
        ({"failure": "meteor"}, "w:2: failure: expected one of overloaded, server_error"),
        (
            {"failure": "idle_timeout", "outcome": "failed"},
            "w:2: failure idle_timeout ends a run timed_out, but outcome is 'failed'",
        ),
    ],
)
def test_a_malformed_spend_or_failure_names_its_line_and_key(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(TraceFormatError) as raised:
        read_workload_text(line(**fields), "w")
    assert str(raised.value).startswith(message), raised.value


def test_a_failure_without_an_outcome_must_still_say_the_outcome_it_ends_with() -> None:
    with pytest.raises(TraceFormatError, match="ends a run failed, but outcome is 'succeeded'"):
        read_workload_text(line(failure="crash"), "w")
    plan = read_workload_text(line(failure="crash", outcome="failed"), "w").plans["r1"]
    assert (plan.attempts[0].outcome, plan.attempts[0].exit_code) == ("failed", -11)


BAD_FLAGS = [
    (
        ("--tokens", "gemini=input:5"),
        "--tokens: unknown provider 'gemini'; expected one of claude, codex",
    ),
    (
        ("--tokens", "claude=inputs:5"),
        "--tokens: claude: unknown kind 'inputs'; expected input, cache_read, cache_write,"
        " output or sigma",
    ),
    (
        ("--tokens", "claude=input:5q"),
        "--tokens: claude: input: expected a count such as 1200, 20k or 1.5M, got '5q'",
    ),
    (("--tokens", "claude=input:0"), "--tokens: claude: give at least one kind a mean > 0"),
    (
        ("--tokens", "claude=input:5,sigma:9"),
        "--tokens: claude: sigma: expected a number from 0 to 5, got '9'",
    ),
    (
        ("--tokens", "claude=input:5", "--token-prices", "codex=input:3"),
        "--token-prices: codex has no --tokens to price; add --tokens codex=...",
    ),
    (
        ("--tokens", "claude=input:5", "--token-prices", "claude=input:-3"),
        "--token-prices: claude: input (dollars per million tokens): expected a number >= 0",
    ),
    (
        ("--failures", "meteor=0.1"),
        "--failures: unknown name 'meteor'; expected one of " + ", ".join(FAILURE_CLASSES),
    ),
    (
        ("--failures", "crash=0.6", "--outcomes", "failed=0.6"),
        "--outcomes and --failures: their shares add up to more than 1",
    ),
]


@pytest.mark.parametrize(("flags", "message"), BAD_FLAGS)
def test_a_bad_spend_flag_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], message: str
) -> None:
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    argv = ["sim", "generate", "-c", str(tmp_path / "supervisor.toml"), "--span", "1h"]
    argv += ["--arrivals", "poisson:5", "--durations", "exponential:60", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"herdsman: {message}"), err
    assert len(err.splitlines()) == 1
