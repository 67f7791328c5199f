"""The supervisor's Prometheus metrics: exact counts, each labelled child looked up once."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from herdsman.runtime.metrics import Metrics
from herdsman.runtime.thread_calls import ThreadCalls

PROVIDERS = ("claude", "codex")
OUTCOMES = ("succeeded", "failed", "cancelled")


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, by name and sorted labels (creation times left out)."""
    text = metrics.render().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


Event = tuple[str, str, str, float]
events = st.lists(
    st.tuples(
        st.sampled_from(["submit", "start", "finish", "duration"]),
        st.sampled_from(PROVIDERS),
        st.sampled_from(OUTCOMES),
        st.floats(min_value=0, max_value=20000, allow_nan=False),
    ),
    max_size=60,
)


@given(events)
def test_counting_methods_export_what_direct_labels_calls_would(script: list[Event]) -> None:
    kept, direct = Metrics(), Metrics()
    for kind, provider, outcome, seconds in script:
        if kind == "submit":
            kept.count_submit(provider)
            direct.submitted.labels(provider).inc()
        elif kind == "start":
            kept.count_start(provider, seconds)
            direct.started.labels(provider).inc()
            direct.queue_wait.labels(provider).observe(seconds)
        elif kind == "finish":
            kept.count_finish(provider, outcome)
            direct.finished.labels(provider, outcome).inc()
        else:
            kept.observe_duration(provider, seconds)
            direct.run_duration.labels(provider).observe(seconds)
    assert samples(kept) == samples(direct)


def test_each_labelled_child_is_looked_up_once(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = Metrics()
    lookups: list[tuple[str, tuple[str, ...]]] = []
    original = MetricWrapperBase.labels

    def counting(self: MetricWrapperBase, *values: str) -> MetricWrapperBase:
        lookups.append((self._name, values))
        return original(self, *values)

    monkeypatch.setattr(MetricWrapperBase, "labels", counting)
    for _ in range(5):
        for provider in PROVIDERS:
            metrics.count_submit(provider)
            metrics.count_start(provider, 0.5)
            metrics.count_finish(provider, "succeeded")
            metrics.observe_duration(provider, 2.0)
    assert sorted(lookups) == sorted(
        (name, values)
        for provider in PROVIDERS
        for name, values in (
            ("herdsman_runs_submitted", (provider,)),
            ("herdsman_runs_started", (provider,)),
            ("herdsman_queue_wait_seconds", (provider,)),
            ("herdsman_runs_finished", (provider, "succeeded")),
            ("herdsman_run_duration_seconds", (provider,)),
        )
    )
    counted = samples(metrics)
    for provider in PROVIDERS:
        assert counted[("herdsman_runs_submitted_total", (("provider", provider),))] == 5
        finished = (("outcome", "succeeded"), ("provider", provider))
        assert counted[("herdsman_runs_finished_total", finished)] == 5
        assert counted[("herdsman_queue_wait_seconds_count", (("provider", provider),))] == 5


async def test_the_worker_thread_pools_cpu_and_calls_are_exported() -> None:
    def burn(_: None) -> None:
        until = time.thread_time() + 0.02
        while time.thread_time() < until:
            pass

    calls = ThreadCalls(burn, max_threads=1, pool="metrics-test")
    before = samples(Metrics())
    await calls.call(None)
    await calls.call(None)
    after = samples(Metrics())
    cpu = ("herdsman_worker_thread_cpu_seconds_total", (("pool", "metrics-test"),))
    took = ("herdsman_worker_thread_seconds_total", (("pool", "metrics-test"),))
    made = ("herdsman_worker_thread_calls_total", (("pool", "metrics-test"),))
    assert after[made] - before.get(made, 0) == 2
    assert after[cpu] - before.get(cpu, 0) >= 0.04
    assert after[took] - before.get(took, 0) >= after[cpu] - before.get(cpu, 0)


def test_a_runs_spend_is_counted_by_provider_account_model_and_kind() -> None:
    from herdsman.runtime.metrics import Uncounted
    from herdsman.runtime.runner.run_usage import ModelUsage, Tokens
    from herdsman.runtime.store import Spend

    metrics = Metrics()
    by_model = Spend(
        Tokens(input=30, cache_read=400, output=9),
        0.5,
        (
            ModelUsage("big", Tokens(input=20, cache_read=400, output=5, reasoning=2), 0.4),
            ModelUsage("small", Tokens(input=10, output=4), None),
        ),
    )
    metrics.count_spend("claude", "work", by_model)
    metrics.count_spend("claude", "work", by_model)
    # A stream that named no model counts under model "", the ambient account under "".
    metrics.count_spend("codex", None, Spend(Tokens(input=7, cache_write=3)))
    metrics.count_spend("codex", None, Spend(cost_usd=0.25))
    metrics.count_spend("codex", None, Spend(turns=2))  # nothing to count
    tokens = {
        (labels["provider"], labels["account"], labels["model"], labels["kind"]): value
        for (name, pairs), value in samples(metrics).items()
        if name == "herdsman_tokens_total"
        for labels in [dict(pairs)]
    }
    assert tokens == {
        ("claude", "work", "big", "input"): 40,
        ("claude", "work", "big", "cache_read"): 800,
        ("claude", "work", "big", "output"): 10,
        ("claude", "work", "small", "input"): 20,
        ("claude", "work", "small", "output"): 8,
        ("codex", "", "", "input"): 7,
        ("codex", "", "", "cache_write"): 3,
    }
    cost = {
        dict(pairs)["model"]: value
        for (name, pairs), value in samples(metrics).items()
        if name == "herdsman_cost_usd_total"
    }
    assert cost == {"big": pytest.approx(0.8), "": 0.25}
    quiet = Uncounted()
    quiet.count_spend("claude", "work", by_model)
    assert not [name for name, _ in samples(quiet) if name == "herdsman_tokens_total"]
