"""Both simulation engines take the same decisions: the shipped samples and random workloads."""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from random_workloads import STARTED_AT, loaded_from, workloads

from herdsman.config import LoadedConfig
from herdsman.config.report import config_as_json
from herdsman.runtime.runner.api_failure import ApiFailure
from herdsman.runtime.runner.run_usage import RunUsage
from herdsman.sim.decisions import timeline_of
from herdsman.sim.diff import first_divergence, report
from herdsman.sim.engine import FastEngine, fast_replay
from herdsman.sim.metrics import measure
from herdsman.sim.plan import fast_engine
from herdsman.sim.replay import replay
from herdsman.sim.result import ReplayResult
from herdsman.sim.workload import (
    Arrival,
    Attempt,
    RunPlan,
    Workload,
    config_from_trace,
    read_workload,
)
from herdsman.trace import TraceEvent, TraceHeader, format_time, read_trace_text

SIM = Path(__file__).parents[2] / "sim"


@pytest.fixture(autouse=True)
def _quiet() -> None:
    # Usage limits and checkouts are logged by the simulated supervisor.
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def events_of(text: str, name: str) -> list[TraceEvent]:
    """The trace's events."""
    return list(read_trace_text(text, name)[1])


def assert_same_decisions(trio_run: ReplayResult, fast_run: ReplayResult) -> None:
    """Equal decisions (with `sim diff`'s report if not), then equal traces and figures."""
    trio_events, fast_events = events_of(trio_run.trace, "trio"), events_of(fast_run.trace, "fast")
    a, b = timeline_of(trio_events), timeline_of(fast_events)
    divergence = first_divergence(a, b)
    assert divergence is None, report(divergence, a, b, ("trio", "fast"))
    # Everything else too: inputs, times, exit codes, reload configurations.
    assert fast_run.trace.partition("\n")[0] == trio_run.trace.partition("\n")[0]
    assert [(e.t, e.event, e.fields) for e in fast_events] == [
        (e.t, e.event, e.fields) for e in trio_events
    ]
    # Byte for byte, forced shutdowns included: the runs one cancels end in
    # arrival order in both engines, never in trio's wake-up order.
    assert fast_run.trace == trio_run.trace
    assert (fast_run.runs, fast_run.span, fast_run.left_queued) == (
        trio_run.runs,
        trio_run.span,
        trio_run.left_queued,
    )
    # The trio replay lists them in the order its run tasks woke: a set.
    assert sorted(fast_run.defaulted) == sorted(trio_run.defaulted)


@pytest.mark.parametrize("name", ["demo-recorded", "team-day", "faults-recorded"])
def test_the_fast_engine_replays_a_shipped_input_to_its_golden_output(name: str) -> None:
    workload = read_workload(SIM / f"{name}.jsonl")
    result = fast_replay(workload, config_from_trace(workload.header.config, name))
    golden = (SIM / f"{name}.golden.jsonl").read_text(encoding="utf-8")
    assert result.trace == golden


def test_the_engines_agree_on_a_shipped_input_under_a_what_if() -> None:
    workload = read_workload(SIM / "team-day.jsonl")
    what_if = config_from_trace(
        workload.header.config, "team-day", ["providers.claude.concurrency=1"]
    )
    assert_same_decisions(replay(workload, what_if), fast_replay(workload, what_if))


def retry_pending_at_a_drain() -> tuple[Workload, LoadedConfig]:
    """A run retried after a dropped connection, its backoff cut short by a drain.

    The shape of a falsifying example drawn at random: the supervisor counts
    the run still queued (the ledger has it so), the fast engine once did not.
    """
    loaded = loaded_from(
        '[supervisor]\nstate_dir = "/sim/state"\nshutdown_grace = "1s"\n'
        '[providers.codex]\nexec = ["codex"]\nprotocol = "codex"\n'
        '[providers.codex.retry]\nattempts = 3\non = ["connection"]\nbackoff = "30s"\n'
    )
    dropped = Attempt(0.0, "failed", 0, usage=RunUsage(failure=ApiFailure.CONNECTION))
    runs = {"r0": RunPlan(0, [dropped]), "r1": RunPlan(1, [Attempt(60.0, "succeeded", 0)])}
    arrivals = (
        Arrival(0.0, "submit", {"run": {"id": "r0", "provider": "codex"}}),
        Arrival(0.0, "submit", {"run": {"id": "r1", "provider": "codex"}}),
        Arrival(0.0, "submit", {"run": {"id": "r2", "provider": "codex"}}),
        Arrival(1.0, "shutdown", {}),
    )
    started = format_time(dt.datetime.fromtimestamp(STARTED_AT, dt.UTC))
    header = TraceHeader(1, started, config_as_json(loaded.config), None)
    return Workload(header, STARTED_AT, arrivals, runs), loaded


@settings(
    max_examples=int(os.environ.get("HERDSMAN_EQUIVALENCE_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(workloads())
@example(retry_pending_at_a_drain())
def test_the_engines_agree_on_random_workloads(case: tuple[Workload, LoadedConfig]) -> None:
    workload, loaded = case
    assert_same_decisions(replay(workload, loaded), fast_replay(workload, loaded))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
@pytest.mark.slow
def test_the_fast_engine_decides_the_same_without_writing_a_trace(
    case: tuple[Workload, LoadedConfig],
) -> None:
    # Planning runs it without a trace, on a leaner path: same waits, same end.
    workload, loaded = case
    traced = FastEngine(workload, loaded, trace=True, waits=True)
    traced.run()
    bare = FastEngine(workload, loaded, trace=False, waits=True)
    bare.run()
    assert bare.text == ""
    assert (bare.waits, bare.picks, bare.now, bare.runs, bare.left_queued, bare.defaulted) == (
        traced.waits,
        traced.picks,
        traced.now,
        traced.runs,
        traced.left_queued,
        traced.defaulted,
    )


def assert_metrics_as_measured(workload: Workload, loaded: LoadedConfig) -> None:
    """What ``sim plan`` gets from the engine is what measure() reads in its trace."""
    traced = FastEngine(workload, loaded, trace=True)
    traced.run()
    assert fast_engine(workload, loaded) == measure(traced.text)


@pytest.mark.parametrize("name", ["demo-recorded", "team-day"])
def test_the_fast_engines_metrics_are_its_traces_on_a_shipped_input(name: str) -> None:
    workload = read_workload(SIM / f"{name}.jsonl")
    assert_metrics_as_measured(workload, config_from_trace(workload.header.config, name))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
@pytest.mark.slow
def test_the_fast_engines_metrics_are_its_traces_on_random_workloads(
    case: tuple[Workload, LoadedConfig],
) -> None:
    assert_metrics_as_measured(*case)


def test_metrics_are_only_given_when_asked_for() -> None:
    workload = read_workload(SIM / "team-day.jsonl")
    engine = FastEngine(workload, config_from_trace(workload.header.config, "team-day"))
    engine.run()
    with pytest.raises(ValueError, match="metrics=True"):
        engine.metrics()
