"""Student-t intervals without SciPy: the closed-form CDF, its quantile, coverage."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.sim.stats import Estimate, estimate, t_cdf_two_sided, t_quantile

# Two-sided 95% and 99% points of Student's t, from any statistics table.
TABLE = [
    (1, 12.706, 63.657),
    (2, 4.303, 9.925),
    (3, 3.182, 5.841),
    (4, 2.776, 4.604),
    (9, 2.262, 3.250),
    (10, 2.228, 3.169),
    (29, 2.045, 2.756),
    (120, 1.980, 2.617),
]


@pytest.mark.parametrize(("df", "t95", "t99"), TABLE)
def test_quantiles_match_the_published_table(df: int, t95: float, t99: float) -> None:
    assert t_quantile(0.95, df) == pytest.approx(t95, abs=6e-4)
    assert t_quantile(0.99, df) == pytest.approx(t99, abs=6e-4)


def test_many_degrees_of_freedom_tend_to_the_normal() -> None:
    z = statistics.NormalDist().inv_cdf(0.975)
    assert t_quantile(0.95, 5000) == pytest.approx(z, abs=1e-3)


@given(st.integers(1, 200), st.floats(0.01, 0.999))
def test_the_quantile_inverts_the_cdf(df: int, confidence: float) -> None:
    t = t_quantile(confidence, df)
    assert t_cdf_two_sided(t, df) == pytest.approx(confidence, abs=1e-9)


@given(st.integers(1, 60), st.floats(0, 50), st.floats(0, 50))
def test_the_cdf_grows_from_zero_towards_one(df: int, a: float, b: float) -> None:
    low, high = sorted((a, b))
    # Rounding only: the sums are exact to about 1e-15.
    assert 0 <= t_cdf_two_sided(low, df) <= t_cdf_two_sided(high, df) + 1e-12 <= 1 + 2e-12
    assert t_cdf_two_sided(0, df) == 0


def test_intervals_of_five_normal_values_cover_the_mean_95_percent_of_the_time() -> None:
    rng = random.Random(11)
    trials, covered = 4000, 0
    for _ in range(trials):
        values = [rng.gauss(10, 3) for _ in range(5)]
        interval = estimate(values)
        covered += interval.low <= 10 <= interval.high
    # A normal quantile (1.96) instead of t (2.776) would cover only about 88%.
    assert covered / trials == pytest.approx(0.95, abs=0.012)


def test_one_value_has_no_interval() -> None:
    single = estimate([4.0])
    assert (single.mean, single.low, single.high) == (4.0, 4.0, 4.0)
    with pytest.raises(ValueError, match="no values"):
        estimate([])


@pytest.mark.parametrize("value", [0.1, 0.7, 246.0, 1e-9])
@pytest.mark.parametrize("n", [2, 3, 7, 10])
def test_identical_replications_estimate_exactly_their_value(value: float, n: int) -> None:
    # fsum([0.1] * 3) / 3 is 0.10000000000000002: an SLO of exactly 0.1 that
    # every replication meets would fail on the rounding.
    assert estimate([value] * n) == Estimate(value, value, value, (value,) * n)


@given(st.lists(st.floats(0, 1e6), min_size=2, max_size=12))
def test_the_mean_is_never_outside_the_values(values: list[float]) -> None:
    mean = estimate(values).mean
    assert min(values) <= mean <= max(values)
