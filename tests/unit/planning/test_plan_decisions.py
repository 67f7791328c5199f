"""Verdicts of an interval against an SLO, and how many replications would settle one."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.sim.plan import Replications
from herdsman.sim.slo import parse_slo
from herdsman.sim.stats import Estimate, estimate, replications_to_decide, t_quantile


def interval(mean: float, low: float, high: float) -> Estimate:
    return Estimate(mean, low, high, ())


@pytest.mark.parametrize(
    ("slo", "low", "high", "verdict"),
    [
        ("p95_wait<=60", 10, 50, "meets"),
        ("p95_wait<=60", 10, 60, "meets"),
        ("p95_wait<=60", 61, 90, "misses"),
        ("p95_wait<=60", 40, 80, "undecided"),
        ("p95_wait<60", 40, 60, "undecided"),
        ("utilisation>=0.5", 0.5, 0.9, "meets"),
        ("utilisation>=0.5", 0.1, 0.4, "misses"),
        ("utilisation>=0.5", 0.4, 0.6, "undecided"),
    ],
)
def test_a_clause_is_met_missed_or_undecided_by_the_whole_interval(
    slo: str, low: float, high: float, verdict: str
) -> None:
    (clause,) = parse_slo(slo).clauses
    assert clause.verdict(interval((low + high) / 2, low, high)) == verdict


def test_a_missed_clause_decides_the_slo_and_an_undecided_one_keeps_it_open() -> None:
    slo = parse_slo("p95_wait<=60,utilisation>=50%")
    good, open_, bad = interval(30, 20, 40), interval(0.5, 0.4, 0.6), interval(0.2, 0.1, 0.3)
    assert slo.verdict({"p95_wait": good, "utilisation": interval(0.7, 0.6, 0.8)}) == "meets"
    assert slo.verdict({"p95_wait": good, "utilisation": open_}) == "undecided"
    assert slo.verdict({"p95_wait": interval(90, 70, 110), "utilisation": open_}) == "misses"
    assert slo.verdict({"p95_wait": good, "utilisation": bad}) == "misses"


@given(
    st.lists(st.floats(0, 1e5), min_size=2, max_size=12).filter(lambda v: len(set(v)) > 1),
    st.floats(0, 1e5),
    st.sampled_from([0.95, 0.99]),
)
def test_the_replications_to_settle_are_where_the_half_width_falls_under_the_distance(
    values: list[float], threshold: float, confidence: float
) -> None:
    n = replications_to_decide(values, threshold, confidence)
    mean = math.fsum(values) / len(values)
    if mean == threshold:
        assert n is None
        return
    assert n is not None
    assert n >= 2
    s = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    distance = abs(mean - threshold)

    def half(m: int) -> float:
        # Past 1000 degrees of freedom the answer uses the normal quantile.
        normal = statistics.NormalDist().inv_cdf((1 + confidence) / 2)
        q = t_quantile(confidence, m - 1) if m <= 1001 else normal
        return q * s / math.sqrt(m)

    assert half(n) < distance * (1 + 1e-6)
    if n > 2:
        assert half(n - 1) >= distance * (1 - 1e-3)


def test_replications_to_settle_grow_as_the_square_of_the_spread_over_the_distance() -> None:
    values = [100.0, 300.0, 500.0, 900.0, 200.0]
    near = replications_to_decide(values, 450, 0.95)
    far = replications_to_decide(values, 1000, 0.95)
    assert near is not None
    assert far is not None
    assert far < near
    # Settled at the estimate: the same mean and spread, that many times, decide.
    assert estimate(values).high > 450 > estimate(values).low
    assert replications_to_decide([5.0, 5.0], 1) is None  # no spread: nothing to extrapolate


def test_auto_looks_double_from_five_to_the_cap_and_split_the_five_percent() -> None:
    auto = Replications.automatic()
    assert auto.looks == (5, 10, 20, 40, 80, 100)
    assert auto.confidence == pytest.approx(1 - 0.05 / 6)
    assert Replications.automatic(5).looks == (5,)
    assert Replications.automatic(40).looks == (5, 10, 20, 40)
    assert Replications.automatic(41).looks == (5, 10, 20, 40, 41)
    assert Replications.fixed(7).looks == (7,)
    assert Replications.fixed(7).confidence == 0.95
