"""The replay runs the supervisor with its runs left uncounted; the runtime counts them.

Nothing in the simulator serves or reads ``/metrics``, so the replay hands
the supervisor :class:`~herdsman.runtime.metrics.Uncounted` (what
``prometheus_client`` cost per run is in docs/simulator.md). The runtime's
own counts are checked through its HTTP API in
tests/integration/supervisor/test_api.py; here, that the sink is what leaves
them out and nothing else of the replay changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sim_workloads import busy_trace

from herdsman.runtime.metrics import Metrics, Uncounted
from herdsman.runtime.supervisor import Supervisor
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload

RUN_COUNTS = (
    "herdsman_runs_submitted_total",
    "herdsman_runs_started_total",
    "herdsman_runs_finished_total",
    "herdsman_queue_wait_seconds_count",
    "herdsman_run_duration_seconds_count",
)


def _counts(metrics: Metrics) -> dict[str, float]:
    """The run counts of the exposition, summed over their labels."""
    totals = dict.fromkeys(RUN_COUNTS, 0.0)
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


def _replay_keeping_metrics(trace: Path, monkeypatch: pytest.MonkeyPatch) -> list[Metrics]:
    kept: list[Metrics] = []
    honest = Supervisor.__init__

    def keeping(self: Supervisor, *args: Any, **kwargs: Any) -> None:
        honest(self, *args, **kwargs)
        kept.append(self.metrics)

    monkeypatch.setattr(Supervisor, "__init__", keeping)
    workload = read_workload(trace)
    replay(workload, config_from_trace(workload.header.config, "header"))
    return kept


def test_a_replays_supervisor_counts_no_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = _replay_keeping_metrics(busy_trace(tmp_path / "busy.jsonl", runs=20), monkeypatch)
    assert len(kept) == 1
    assert isinstance(kept[0], Uncounted)
    assert _counts(kept[0]) == dict.fromkeys(RUN_COUNTS, 0.0)


def test_a_replays_supervisor_does_not_even_call_the_run_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    for name in ("count_submit", "count_start", "count_finish", "observe_duration"):
        monkeypatch.setattr(
            Uncounted, name, lambda self, *args, name=name: calls.append(name), raising=True
        )
    trace = busy_trace(tmp_path / "busy.jsonl", runs=20)
    workload = read_workload(trace)
    result = replay(workload, config_from_trace(workload.header.config, "header"))
    assert result.runs == 20
    assert calls == []


def test_uncounted_leaves_out_run_counts_and_keeps_the_configuration_gauges() -> None:
    counted, uncounted = Metrics(), Uncounted()
    for metrics in (counted, uncounted):
        metrics.count_submit("claude")
        metrics.count_start("claude", 1.5)
        metrics.count_finish("claude", "succeeded")
        metrics.observe_duration("claude", 30.0)
        metrics.config_generation.set(3)
    assert _counts(counted) == dict.fromkeys(RUN_COUNTS, 1.0)
    assert _counts(uncounted) == dict.fromkeys(RUN_COUNTS, 0.0)
    assert b"herdsman_config_generation 3.0" in uncounted.render()
