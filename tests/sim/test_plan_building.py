"""How a plan builds its replications and shares them out, without changing what it answers.

A drawn replication is the workload its generated text reads as; the
collector's thresholds are the plan's only while it runs; every
(configuration, replication) is simulated once, whole replications while
each worker can have one and the rest dealt out.
"""

from __future__ import annotations

import gc
import json
import pickle
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_workloads import busy_trace, config_json

from herdsman.cli import main
from herdsman.config import LoadedConfig
from herdsman.sim.collector import YOUNG_COLLECTIONS_RARER
from herdsman.sim.generate import Samples, generate, generate_workload
from herdsman.sim.metrics import Metrics
from herdsman.sim.model import Arrivals, Durations, Model, PerKind, TokenModel
from herdsman.sim.plan import PlanInput, _Job, _tasks, _Worker, fast_engine, plan, read_input
from herdsman.sim.slo import parse_slo
from herdsman.sim.sweep import parse_vary
from herdsman.sim.workload import Workload, read_workload_text
from herdsman.trace import read_trace, read_trace_text

SAMPLES = Samples(gaps=(30.0, 95.5, 240.0), durations=(12.0, 60.25, 300.0))


@st.composite
def models(draw: st.DrawFn) -> Model:
    """Small models using every part a model may have: each is drawn in its own way."""
    arrivals = draw(
        st.sampled_from([Arrivals("poisson", rate=40.0), Arrivals("recorded", trace="gaps")])
    )
    durations = draw(
        st.sampled_from(
            [
                Durations("exponential", mean=90.0),
                Durations("lognormal", mean=120.0, sigma=1.2),
                Durations("empirical", trace="durations"),
            ]
        )
    )
    shaped = arrivals.kind == "poisson" and draw(st.booleans())
    spends = draw(st.booleans())
    return Model(
        span=draw(st.sampled_from([1800.0, 4 * 3600.0])),
        arrivals=arrivals,
        durations=durations,
        providers=(("claude", 3.0), ("codex", 1.0)),
        profile=tuple(float(1 + h % 3) for h in range(24)) if shaped else None,
        week=(1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5) if shaped else None,
        turns=draw(st.sampled_from([1.0, 2.5])),
        think=draw(st.sampled_from([0.0, 120.0])),
        outcomes=draw(st.sampled_from([(), (("failed", 0.1), ("timed_out", 0.05))])),
        usage_limited=draw(st.sampled_from([(), (("claude", 0.2),)])),
        tokens=(("claude", TokenModel(PerKind(input=20_000, output=8_000), 0.5)),)
        if spends
        else (),
        prices=(("claude", PerKind(input=3, output=15)),) if spends else (),
        failures=(("overloaded", 0.1), ("crash", 0.05)) if spends else (),
    )


@settings(max_examples=40, deadline=None)
@given(model=models(), seed=st.integers(min_value=0, max_value=2**63 - 1))
def test_a_drawn_replication_is_the_workload_its_text_reads_as(model: Model, seed: int) -> None:
    config = config_json()
    text = generate(model, config, seed, SAMPLES)
    drawn = generate_workload(model, config, seed, SAMPLES, "drawn")
    assert drawn == read_workload_text(text, "drawn")
    assert drawn.plans, "the model drew no run: the comparison would be empty"


def test_a_trace_read_from_text_splits_lines_as_read_from_its_file(tmp_path: Path) -> None:
    # A prompt may hold characters str.splitlines() breaks a line at (U+2028,
    # U+0085): the trace writer leaves them as they are, and a file's lines
    # end at a newline only. A worker reads the plan's input from its text.
    lines = [
        '{"herdsman_trace":1,"started_at":"2026-11-29T12:00:00.000000Z","config":{}}',
        '{"t":1.0,"seq":0,"event":"submit","run":{"id":"a","provider":"claude",'
        '"prompt":"one\u2028two\x85three"}}',
        '{"t":2.0,"seq":1,"event":"submit","run":{"id":"b","provider":"claude"}}\r',
    ]
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")
    header, events = read_trace(path)
    text_header, text_events = read_trace_text(path.read_text(encoding="utf-8"), str(path))
    assert text_header == header
    assert list(text_events) == list(events)


def recording_engine(workload: Workload, loaded: LoadedConfig) -> Metrics:
    """The fast engine, noting the collector's thresholds it ran under."""
    SEEN.append(gc.get_threshold())
    return fast_engine(workload, loaded)


SEEN: list[tuple[int, int, int]] = []


def generated(tmp_path: Path) -> Path:
    out = tmp_path / "workload.jsonl"
    model = Model(
        span=3 * 3600.0,
        arrivals=Arrivals("poisson", rate=20.0),
        durations=Durations("exponential", mean=240.0),
        providers=(("claude", 3.0), ("codex", 1.0)),
        turns=2.0,
    )
    out.write_text(generate(model, config_json(), 11, Samples()), encoding="utf-8")
    return out


def test_a_plan_collects_rarely_and_gives_the_thresholds_back(
    tmp_path: Path, thresholds: tuple[int, int, int]
) -> None:
    SEEN.clear()
    vary = parse_vary("providers.claude.concurrency=1,2")
    source = read_input(generated(tmp_path))
    plan(source, [vary], parse_slo("p95_wait<=1h"), replications=2, engine=recording_engine)
    assert SEEN == [(500 * YOUNG_COLLECTIONS_RARER, 7, 9)] * 4
    assert gc.get_threshold() == thresholds


@pytest.mark.parametrize("replications", [1, 3])
def test_a_plan_dealt_out_to_two_workers_answers_as_one_does(
    tmp_path: Path, replications: int
) -> None:
    # Three replications on two workers: the third is dealt out to both.
    source = read_input(generated(tmp_path))
    varies = [parse_vary("providers.claude.concurrency=1..3")]
    slo = parse_slo("p95_wait<=10m")
    one = plan(source, varies, slo, replications=replications, workers=1)
    two = plan(source, varies, slo, replications=replications, workers=2)
    assert two == one


batches = st.integers(min_value=1, max_value=12).flatmap(
    lambda configs: st.dictionaries(
        st.integers(min_value=0, max_value=30),
        st.lists(st.integers(0, configs - 1), unique=True).map(sorted),
        max_size=12,
    )
)


@settings(max_examples=200, deadline=None)
@given(batch=batches, workers=st.integers(min_value=1, max_value=6))
def test_tasks_cover_every_simulation_once_and_deal_out_only_the_last(
    batch: Mapping[int, Sequence[int]], workers: int
) -> None:
    tasks = _tasks(batch, workers)
    done = Counter((number, c) for number, configs in tasks for c in configs)
    assert done == Counter((number, c) for number, configs in batch.items() for c in configs)
    assert all(configs for _, configs in tasks)
    numbers = [number for number, _ in tasks]
    assert numbers == sorted(numbers)  # replication by replication
    replications = sorted(set(numbers))
    whole = len(replications) - len(replications) % workers
    pieces = Counter(numbers)
    for number in replications[:whole]:
        assert pieces[number] == 1, f"replication {number} was split, though shared out whole"
    for number in replications[whole:]:
        # One task per worker (or per configuration, if fewer), sizes within one.
        assert pieces[number] == min(workers, len(batch[number]))
        sizes = [len(configs) for n, configs in tasks if n == number]
        assert max(sizes) - min(sizes) <= 1


def test_workers_are_given_the_input_as_text_not_as_the_workload_read_from_it(
    tmp_path: Path,
) -> None:
    source = read_input(generated(tmp_path))
    job = _Job.of(source, ({},), 0, fast_engine)
    sent = attrs.astuple(job, recurse=False)
    assert source.text in sent
    assert not any(isinstance(part, (Workload, PlanInput)) for part in sent)
    assert pickle.loads(pickle.dumps(job)) == job
    # What a worker reads from the text is what the plan's process read.
    assert _Worker(job)._replication(0) == source.workload


def test_a_recorded_trace_with_odd_characters_plans_the_same_on_any_number_of_workers(
    tmp_path: Path,
) -> None:
    # Each worker reads the trace from its text: a U+2028 in a prompt must
    # not split a line there (it did for text, never for a file).
    trace = busy_trace(tmp_path / "busy.jsonl", runs=30)
    lines = trace.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[1])
    first["run"]["prompt"] = "look\u2028here\x85too"
    trace.write_text(
        "\n".join([lines[0], json.dumps(first, ensure_ascii=False), *lines[2:]]) + "\n"
    )
    source = read_input(trace)
    varies = [parse_vary("supervisor.max_concurrency=1..2")]
    slo = parse_slo("p95_wait<=10m")
    one = plan(source, varies, slo, replications=2, workers=1)
    assert plan(source, varies, slo, replications=2, workers=2) == one


def test_an_input_that_is_not_text_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "trace.jsonl.gz"
    binary.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    argv = ["sim", "plan", str(binary), "--vary", "supervisor.max_concurrency=1"]
    assert main([*argv, "--slo", "p95_wait<=1m"]) == 2
    assert capsys.readouterr().err == (
        f"herdsman: {binary}: not UTF-8 text (byte 1 cannot be decoded): not a trace\n"
    )
