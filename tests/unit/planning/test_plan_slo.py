"""``--slo``: parsing with precise errors, and meeting a clause on the whole interval."""

from __future__ import annotations

import pytest

from herdsman.sim.slo import SloError, parse_slo
from herdsman.sim.stats import Estimate


def interval(mean: float, low: float, high: float) -> Estimate:
    return Estimate(mean, low, high, ())


@pytest.mark.parametrize(
    ("text", "metric", "op", "value"),
    [
        ("p95_wait<=60s", "p95_wait", "<=", 60.0),
        ("p99_wait < 1.5m", "p99_wait", "<", 90.0),
        ("p50_wait<=2h", "p50_wait", "<=", 7200.0),
        ("mean_wait<=30", "mean_wait", "<=", 30.0),
        ("utilisation>=80%", "utilisation", ">=", 0.8),
        ("utilisation>0.5", "utilisation", ">", 0.5),
        ("throughput>=12", "throughput", ">=", 12.0),
        ("usage_limited<=0", "usage_limited", "<=", 0.0),
    ],
)
def test_clauses_read_in_the_metrics_units(text: str, metric: str, op: str, value: float) -> None:
    (clause,) = parse_slo(text).clauses
    assert (clause.metric, clause.op) == (metric, op)
    assert clause.value == pytest.approx(value)


@pytest.mark.parametrize(
    ("text", "value"),
    [("p95_wait<=4.1m", 246.0), ("p95_wait<=0.7h", 2520.0), ("utilisation<=57%", 0.57)],
)
def test_units_convert_without_rounding_below_the_number_meant(text: str, value: float) -> None:
    (clause,) = parse_slo(text).clauses
    assert clause.value == value  # exactly: a wait of exactly 246 s meets p95_wait<=4.1m


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("p95<=60s", "--slo: unknown metric 'p95'; expected one of p50_wait, p95_wait"),
        ("p95_wait=60s", "--slo: 'p95_wait=60s' is not METRIC OP VALUE, e.g. p95_wait<=60s"),
        ("p95_wait<=soon", "--slo: p95_wait<=soon: expected a wait such as 60, 60s, 1.5m or 2h"),
        ("p95_wait<=-5s", "--slo: p95_wait<=-5s: expected a wait such as"),
        ("utilisation>=120%", "--slo: utilisation>=120%: expected a utilisation from 0 to 1"),
        ("timeouts<=-1", "--slo: timeouts<=-1: expected a number >= 0, got '-1'"),
        ("p95_wait<=60s,", "--slo: '' is not METRIC OP VALUE"),
    ],
)
def test_a_bad_slo_names_the_clause_and_what_would_do(text: str, message: str) -> None:
    with pytest.raises(SloError) as info:
        parse_slo(text)
    assert str(info.value).startswith(message)


def test_a_clause_holds_only_when_the_whole_interval_does() -> None:
    slo = parse_slo("p95_wait<=60s,utilisation>=50%")
    good = {"p95_wait": interval(50, 40, 59), "utilisation": interval(0.6, 0.55, 0.65)}
    assert slo.met_by(good)
    # The mean meets it, the interval's far end does not: not met.
    assert not slo.met_by({**good, "p95_wait": interval(50, 30, 70)})
    assert not slo.met_by({**good, "utilisation": interval(0.6, 0.45, 0.75)})
