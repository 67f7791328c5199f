"""What a plan measures in a simulated trace."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.sim.metrics import Metrics, measure, percentile, slots_of
from herdsman.sim.plan import collect
from herdsman.sim.slo import parse_slo

CONFIG = {
    "supervisor": {"max_concurrency": 3},
    "providers": {"claude": {"concurrency": 2}, "codex": {"concurrency": 2}},
}


def trace(events: list[dict[str, Any]], config: dict[str, Any] = CONFIG) -> str:
    header = {"herdsman_trace": 1, "started_at": "2026-11-30T00:00:00Z", "config": config}
    lines = [json.dumps(header)]
    lines += [json.dumps({"seq": seq, **event}) for seq, event in enumerate(events)]
    return "\n".join(lines) + "\n"


def submit(t: float, run: str) -> dict[str, Any]:
    return {"t": t, "event": "submit", "run": {"id": run, "provider": "claude"}}


def start(t: float, run: str) -> dict[str, Any]:
    return {"t": t, "event": "start", "run_id": run, "account": None}


def finish(t: float, run: str, outcome: str = "succeeded", **more: Any) -> dict[str, Any]:
    return {"t": t, "event": "finish", "run_id": run, "outcome": outcome, **more}


def test_waits_busy_time_and_outcomes_are_counted_per_their_definitions() -> None:
    text = trace(
        [
            submit(0, "a"), submit(0, "b"), start(0, "a"), submit(10, "c"),
            start(20, "b"),  # b waited 20 s
            {"t": 30, "event": "usage_limit", "run_id": "a", "provider": "claude",
             "account": None, "until": 1e9},
            finish(30, "a", "usage_limited", requeued=True),
            start(40, "c"),  # c waited 30 s
            start(50, "a"),  # re-queued at 30, started again at 50: a waited 20 s in all
            finish(60, "b", "timed_out"), finish(80, "a"), finish(100, "c"),
            submit(100, "d"),  # never started
            submit(100, "e"), {"t": 100, "event": "cancel", "run_id": "e"},  # withdrawn
        ]
    )  # fmt: skip
    metrics = measure(text)
    assert (metrics.p50_wait, metrics.p99_wait, metrics.mean_wait) == (20, 30, 70 / 3)
    # Busy: a 30 + 30, b 40, c 60 = 160 run-seconds on min(2 + 2, 3) slots over 100 s.
    assert metrics.utilisation == pytest.approx(160 / 300)
    assert metrics.throughput == pytest.approx(3 / (100 / 3600))  # a, b, c ended
    assert (metrics.usage_limited, metrics.timeouts, metrics.unstarted) == (1, 1, 1)


def test_slots_are_the_providers_capped_by_the_global_cap() -> None:
    assert slots_of(CONFIG) == 3
    assert slots_of({"providers": CONFIG["providers"]}) == 4
    assert slots_of({**CONFIG, "supervisor": {"max_concurrency": None}}) == 4


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=200), st.floats(0.1, 100))
def test_a_nearest_rank_percentile_is_a_value_with_enough_below_it(
    values: list[float], p: float
) -> None:
    ordered = sorted(values)
    value = percentile(ordered, p)
    assert value in ordered
    at_most = sum(1 for v in ordered if v <= value)
    below = sum(1 for v in ordered if v < value)
    assert at_most >= p / 100 * len(ordered) - 1e-9
    assert below < p / 100 * len(ordered) + 1e-9


@given(
    st.lists(st.floats(0, 1e4), min_size=6 * 9, max_size=6 * 9),
    st.randoms(use_true_random=False),
)
def test_rows_do_not_depend_on_the_order_results_come_in(
    figures: list[float], shuffler: random.Random
) -> None:
    # Workers finish in any order; the table must be the same.
    combos = [(("supervisor.max_concurrency", str(n)),) for n in (1, 2)]
    results = {
        (c, r): Metrics(*figures[(c * 3 + r) * 9 : (c * 3 + r + 1) * 9])
        for c in range(2)
        for r in range(3)
    }
    arrival = list(results.items())
    shuffler.shuffle(arrival)
    slo = parse_slo("p95_wait<=5000")
    assert collect(combos, dict(arrival), 3, slo) == collect(combos, results, 3, slo)
