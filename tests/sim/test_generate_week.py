"""``sim generate --week``: working days only, with the hours of a day on top."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import pytest
from sim_workloads import CONFIG

from herdsman.cli import main
from herdsman.sim.generate import Samples, generate
from herdsman.sim.model import Arrivals, Durations, Model, model_from_json, model_to_json
from herdsman.sim.plan import read_input
from herdsman.trace import read_trace_text

HOURS = tuple([0.0] * 9 + [3.0] * 8 + [0.0] * 7)  # 9:00 to 17:00, mean 1
WORKING_DAYS = (1.4, 1.4, 1.4, 1.4, 1.4, 0.0, 0.0)  # Monday to Friday, mean 1


def starts(text: str) -> list[float]:
    _, events = read_trace_text(text, "generated")
    return [event.t for event in events]


def test_a_week_keeps_weekends_empty_and_the_rate_a_weekly_mean() -> None:
    # 2026-11-30 is a Monday; eight weeks of one-turn conversations.
    model = Model(
        span=56 * 86400.0,
        arrivals=Arrivals("poisson", rate=10.0),
        durations=Durations("exponential", mean=60.0),
        providers=(("claude", 1.0),),
        profile=HOURS,
        week=WORKING_DAYS,
    )
    times = starts(generate(model, {"providers": {"claude": {}}}, 3, Samples()))
    days = Counter(int(t // 86400) % 7 for t in times)
    assert set(days) == {0, 1, 2, 3, 4}
    assert {int(t % 86400 // 3600) for t in times} <= set(range(9, 17))
    # RATE is the mean over the whole week: 10 an hour, 168 hours, 8 weeks.
    assert len(times) == pytest.approx(10 * 168 * 8, rel=0.05)
    assert model_from_json(model_to_json(model), "here") == model


def test_without_a_week_the_header_and_the_draws_are_as_before() -> None:
    model = Model(
        span=86400.0,
        arrivals=Arrivals("poisson", rate=10.0),
        durations=Durations("exponential", mean=60.0),
        providers=(("claude", 1.0),),
        profile=HOURS,
    )
    assert "week" not in model_to_json(model)
    flat = attrs.evolve(model, week=(1.0,) * 7)
    config: dict[str, Any] = {"providers": {"claude": {}}}
    assert starts(generate(flat, config, 3, Samples())) == starts(
        generate(model, config, 3, Samples())
    )


def test_the_week_flag_and_its_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    out = tmp_path / "w.jsonl"
    argv = ["sim", "generate", "-c", str(tmp_path / "supervisor.toml"), "--span", "14d"]
    argv += ["--arrivals", "poisson:5", "--durations", "lognormal:5m,1", "--out", str(out)]
    assert main([*argv, "--week", "1,1,1,1,1,0,0"]) == 0
    source = read_input(out)  # a plan draws replications from the same model
    assert source.model is not None
    assert source.model.week == WORKING_DAYS
    assert main([*argv, "--week", "1,1,1"]) == 2
    assert capsys.readouterr().err.endswith(
        "--week: expected 7 comma-separated daily weights (Monday to Sunday), got 3\n"
    )
    assert main([*argv, "--week", "0,0,0,0,0,0,0"]) == 2
    assert "--week: at least one daily weight must be > 0" in capsys.readouterr().err
