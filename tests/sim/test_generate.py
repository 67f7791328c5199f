"""``herdsman sim generate``: the model's statistics, determinism, flags, and replay."""

from __future__ import annotations

import itertools
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import CONFIG, busy_trace, config_json, herdsman

from herdsman.cli import main
from herdsman.sim.generate import Samples, generate, load_samples
from herdsman.sim.model import (
    Arrivals,
    Durations,
    Model,
    ModelError,
    model_from_json,
    model_to_json,
)
from herdsman.trace import read_trace_text


def model(**changes: Any) -> Model:
    base: dict[str, Any] = {
        "span": 100 * 3600.0,
        "arrivals": Arrivals("poisson", rate=30.0),
        "durations": Durations("exponential", mean=120.0),
        "providers": (("claude", 1.0), ("codex", 1.0)),
    }
    base.update(changes)
    return Model(**base)


def submits(text: str) -> list[dict[str, Any]]:
    _, events = read_trace_text(text, "generated")
    return [{"t": e.t, **e.fields} for e in events]


def conversations(text: str) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in submits(text):
        by[event["run"]["conversation"]].append(event)
    return by


def test_poisson_arrivals_come_at_the_given_rate() -> None:
    text = generate(model(), config_json(), 1, Samples())
    starts = [turns[0]["t"] for turns in conversations(text).values()]
    rate = len(starts) / 100  # per hour
    assert rate == pytest.approx(30, rel=0.05)
    assert all(0 <= t < 100 * 3600 for t in starts)
    # Exponential gaps: their standard deviation is their mean.
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.07)


@pytest.mark.parametrize(
    "durations",
    [Durations("exponential", mean=120.0), Durations("lognormal", mean=300.0, sigma=0.8)],
)
def test_durations_have_the_given_mean(durations: Durations) -> None:
    text = generate(model(durations=durations), config_json(), 2, Samples())
    drawn = [e["duration"] for e in submits(text)]
    assert statistics.mean(drawn) == pytest.approx(durations.mean, rel=0.05)
    if durations.kind == "lognormal":
        # The median of a lognormal is its mean times exp(-sigma^2 / 2).
        expected = durations.mean * 2.718281828 ** (-(durations.sigma**2) / 2)
        assert statistics.median(drawn) == pytest.approx(expected, rel=0.06)


def test_follow_ups_come_a_duration_and_a_think_time_after_the_turn_before() -> None:
    text = generate(model(turns=3.0, think=600.0), config_json(), 3, Samples())
    by = conversations(text)
    lengths = [len(turns) for turns in by.values()]
    assert statistics.mean(lengths) == pytest.approx(3.0, rel=0.06)
    thinks = []
    for turns in by.values():
        assert len({turn["run"]["provider"] for turn in turns}) == 1  # one provider each
        for before, after in itertools.pairwise(turns):
            thinks.append(after["t"] - before["t"] - before["duration"])
    assert min(thinks) >= -1e-3  # rounding only
    assert statistics.mean(thinks) == pytest.approx(600, rel=0.06)
    # Submits are in time order in the file, numbered by seq.
    _, events = read_trace_text(text, "generated")
    listed = list(events)
    assert [e.seq for e in listed] == list(range(len(listed)))
    assert all(a.t <= b.t for a, b in itertools.pairwise(listed))


def test_a_daily_profile_shapes_arrivals_by_hour() -> None:
    # Nothing at night, three times as much in the afternoon as in the morning.
    profile = tuple([0.0] * 8 + [1.0] * 4 + [3.0] * 4 + [0.0] * 8)
    scaled = tuple(w * 24 / sum(profile) for w in profile)
    text = generate(model(span=40 * 86400.0, profile=scaled), config_json(), 4, Samples())
    hours = Counter(int(turns[0]["t"] % 86400 // 3600) for turns in conversations(text).values())
    assert set(hours) <= set(range(8, 16))
    morning = sum(hours[h] for h in range(8, 12))
    afternoon = sum(hours[h] for h in range(12, 16))
    assert afternoon / morning == pytest.approx(3, rel=0.1)
    # The weights are scaled to a mean of 1: the daily mean rate stays 30 per hour.
    assert (morning + afternoon) / (40 * 24) == pytest.approx(30, rel=0.05)


def test_recorded_arrivals_and_durations_resample_the_trace(tmp_path: Path) -> None:
    recorded = busy_trace(tmp_path / "busy.jsonl", runs=120)
    resampled = model(
        span=7200.0,
        arrivals=Arrivals("recorded", trace=str(recorded)),
        durations=Durations("empirical", trace=str(recorded)),
    )
    samples = load_samples(resampled)
    text = generate(resampled, config_json(), 5, samples)
    drawn = [e["duration"] for e in submits(text)]
    assert set(drawn) <= set(samples.durations)
    assert len(set(drawn)) == len(set(samples.durations))  # all of them show up
    starts = sorted(turns[0]["t"] for turns in conversations(text).values())
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert statistics.mean(gaps) == pytest.approx(statistics.mean(samples.gaps), rel=0.05)


def test_usage_limited_runs_are_the_given_share_of_their_provider() -> None:
    text = generate(
        model(usage_limited=(("claude", 0.1),), outcomes=(("failed", 0.2),)),
        config_json(),
        6,
        Samples(),
    )
    by_provider: dict[str, Counter[str]] = defaultdict(Counter)
    for event in submits(text):
        by_provider[event["run"]["provider"]][event["outcome"]] += 1
    claude, codex = by_provider["claude"], by_provider["codex"]
    assert claude["usage_limited"] / claude.total() == pytest.approx(0.1, abs=0.015)
    assert codex["usage_limited"] == 0
    assert codex["failed"] / codex.total() == pytest.approx(0.2, abs=0.02)


GENERATE = (
    "sim", "generate", "-c", "supervisor.toml", "--span", "2h", "--arrivals", "poisson:20",
    "--profile", ",".join(["1"] * 12 + ["2"] * 12), "--durations", "lognormal:3m,0.9",
    "--turns", "2.5", "--think", "2m", "--usage-limited", "claude=0.1",
    "--outcomes", "failed=0.05,timed_out=0.02",
)  # fmt: skip


def test_same_flags_and_seed_give_the_same_bytes_in_any_process(tmp_path: Path) -> None:
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    outputs = []
    for hash_seed, seed in (("1", "9"), ("4242", "9"), ("7", "10")):
        done = herdsman(*GENERATE, "--seed", seed, cwd=tmp_path, hash_seed=hash_seed)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]  # the seed matters
    header = json.loads(outputs[0].splitlines()[0])
    assert header["generator"]["seed"] == 9
    assert header["config"] == config_json()


def test_a_generated_trace_replays(tmp_path: Path) -> None:
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    made = herdsman(*GENERATE, "--out", "w.jsonl", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    runs = len((tmp_path / "w.jsonl").read_text().splitlines()) - 1
    assert made.stderr.startswith(f"generated {runs} runs over 7200 s")
    replayed = herdsman("sim", "replay", "w.jsonl", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stderr.startswith(f"replayed {runs} runs over ")
    events = [json.loads(line) for line in replayed.stdout.splitlines()[1:]]
    finished = {e["run_id"] for e in events if e["event"] == "finish" and not e.get("requeued")}
    assert len(finished) == runs
    # A usage-limited run rests its account, goes back to the queue, then does its work.
    assert any(e["event"] == "usage_limit" for e in events)


# One flag each, and the start of the one-line error it must give.
BAD_FLAGS = [
    (
        ("--arrivals", "poisson:-3"),
        "--arrivals: poisson rate (conversations per hour): expected a number > 0, got '-3'",
    ),
    (
        ("--arrivals", "poisson:0"),
        "--arrivals: poisson rate (conversations per hour): expected a number > 0, got '0'",
    ),
    (
        ("--arrivals", "weibull:3"),
        "--arrivals: expected poisson:RATE",
    ),
    (
        ("--durations", "gamma:5m"),
        "--durations: expected exponential:MEAN, lognormal:MEAN,SIGMA or empirical:TRACE",
    ),
    (
        ("--durations", "lognormal:5m"),
        "--durations: expected lognormal:MEAN,SIGMA",
    ),
    (
        ("--durations", "exponential:soon"),
        "--durations: exponential mean: expected seconds",
    ),
    (
        ("--durations", "exponential:0"),
        "--durations: exponential mean: expected seconds > 0",
    ),
    (
        ("--span", "-1"),
        "--span: expected seconds > 0, got '-1'",
    ),
    (
        ("--profile", "1,2,3"),
        "--profile: expected 24 comma-separated hourly weights (hour 0 to 23), got 3",
    ),
    (
        ("--profile", ",".join(["0"] * 24)),
        "--profile: at least one hourly weight must be > 0",
    ),
    (
        ("--turns", "0.5"),
        "--turns: mean turns per conversation: expected a number from 1 to 1000, got '0.5'",
    ),
    (
        ("--providers", "gemini=1"),
        "--providers: unknown name 'gemini'; expected one of claude, codex",
    ),
    (
        ("--providers", "claude=0"),
        "--providers: weight of claude: expected a number > 0",
    ),
    (
        ("--usage-limited", "claude=1.5"),
        "--usage-limited: share of claude: expected a number from 0 to 1",
    ),
    (
        ("--outcomes", "crashed=0.1"),
        "--outcomes: unknown name 'crashed'; expected one of failed, timed_out",
    ),
    (
        ("--outcomes", "failed=0.7,timed_out=0.7"),
        "--outcomes: the shares add up to more than 1",
    ),
    (
        ("--start", "2026-11-30T08:00:00"),
        "--start: expected an ISO-8601 time with a zone",
    ),
    (
        ("--turns", "1e15"),
        "--turns: mean turns per conversation: expected a number from 1 to 1000",
    ),
]


@pytest.mark.parametrize(("flags", "message"), BAD_FLAGS)
def test_a_bad_flag_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], message: str
) -> None:
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    args = {"--span": "1h", "--arrivals": "poisson:5", "--durations": "exponential:60"}
    args.update(dict(zip(flags[::2], flags[1::2], strict=True)))
    argv = ["sim", "generate", "-c", str(tmp_path / "supervisor.toml")]
    argv += [part for pair in args.items() for part in pair]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"herdsman: {message}"), err
    assert len(err.splitlines()) == 1


def test_a_missing_or_malformed_recorded_trace_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["sim", "generate", "--span", "1h", "--durations", "exponential:60"]
    assert main([*base, "--arrivals", f"recorded:{tmp_path / 'nope.jsonl'}"]) == 2
    assert "nope.jsonl: cannot read trace" in capsys.readouterr().err
    broken = busy_trace(tmp_path / "busy.jsonl", runs=5)
    lines = broken.read_text().splitlines()
    lines[2] = lines[2].replace('"duration": ', '"duration": -')
    broken.write_text("\n".join(lines) + "\n")
    assert main([*base, "--arrivals", f"recorded:{broken}"]) == 2
    assert capsys.readouterr().err.startswith(f"herdsman: {broken}:3: duration: expected seconds")
    one = busy_trace(tmp_path / "one.jsonl", runs=1)
    assert main([*base, "--arrivals", f"recorded:{one}"]) == 2
    err = capsys.readouterr().err
    assert "resampling arrivals needs at least two conversations" in err
    # Without -c and without a recorded trace, there is no configuration to use.
    assert main([*base, "--arrivals", "poisson:3"]) == 2
    assert "the workload needs a configuration: give -c" in capsys.readouterr().err


def test_a_recorded_trace_lends_its_configuration(tmp_path: Path) -> None:
    recorded = busy_trace(tmp_path / "busy.jsonl", runs=30)
    out = tmp_path / "w.jsonl"
    argv = ["sim", "generate", "--span", "1h", "--arrivals", f"recorded:{recorded}"]
    argv += ["--durations", "exponential:60", "--out", str(out)]
    assert main(argv) == 0
    header = json.loads(out.read_text().splitlines()[0])
    assert header["config"] == json.loads(recorded.read_text().splitlines()[0])["config"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"turns": 0}, "generator.model.turns: expected a number from 1 to 1000, got 0"),
        ({"arrivals": {"kind": "poisson", "rate": 0}}, "generator.model.arrivals.rate"),
        ({"durations": {"kind": "gamma", "mean": 5}}, "generator.model.durations.kind"),
        ({"profile": [1.0] * 23}, "generator.model.profile: expected 24 hourly weights"),
        ({"usage_limited": [["claude", 2.0]]}, "generator.model.usage_limited"),
    ],
)
def test_a_corrupt_model_in_a_generated_header_is_named(
    change: dict[str, object], message: str
) -> None:
    model = model_to_json(
        Model(
            span=3600.0,
            arrivals=Arrivals("poisson", rate=5.0),
            durations=Durations("exponential", mean=60.0),
            providers=(("claude", 1.0),),
        )
    )
    assert model_from_json(model, "w.jsonl:1") is not None
    with pytest.raises(ModelError) as info:
        model_from_json({**model, **change}, "w.jsonl:1")
    assert str(info.value).startswith(f"w.jsonl:1: {message}")
