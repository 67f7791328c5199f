"""Confidence intervals across replications: the mean and Student's t.

No SciPy: for a whole number of degrees of freedom the t distribution's CDF
has a closed form as a finite sum (Abramowitz and Stegun 26.7.3-4), and its
quantile is found by bisection, to far more digits than a plan needs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

__all__ = [
    "Estimate",
    "estimate",
    "replications_to_decide",
    "t_cdf_two_sided",
    "t_quantile",
]

#: Beyond this many degrees of freedom Student's t is taken as the normal
#: distribution (the 97.5% quantile differs by under 0.1%), so that the
#: estimate of how many replications would settle a question stays cheap.
_NORMAL_DF = 1000


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom (``t`` >= 0)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    theta = math.atan(t / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        total, term = 0.0, cos
        for k in range(1, (df - 1) // 2 + 1):
            if k > 1:
                term *= cos * cos * (2 * k - 2) / (2 * k - 1)
            total += term
        return 2 / math.pi * (theta + sin * total) if df > 1 else 2 * theta / math.pi
    total, term = 1.0, 1.0
    for k in range(1, df // 2):
        term *= cos * cos * (2 * k - 1) / (2 * k)
        total += term
    return sin * total


def t_quantile(confidence: float, df: int) -> float:
    """The t with P(|T| <= t) = ``confidence``: 2.776 for 95% and 4 degrees of freedom."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    low, high = 0.0, 1.0
    while t_cdf_two_sided(high, df) < confidence:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if t_cdf_two_sided(middle, df) < confidence:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * high:
            break
    return (low + high) / 2


@attrs.frozen
class Estimate:
    """A metric over replications: its mean and confidence interval (95% unless told).

    With one replication there is no interval: ``low`` and ``high`` are the mean.
    """

    mean: float
    low: float
    high: float
    values: tuple[float, ...]
    confidence: float = 0.95


def estimate(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """The mean of ``values`` and its Student-t confidence interval at ``confidence``."""
    if not values:
        raise ValueError("no values to estimate from")
    n = len(values)
    smallest, largest = min(values), max(values)
    if smallest == largest:
        # Identical replications: the value itself, not fsum's rounding of
        # it (three times 0.1 averages to 0.10000000000000002, which would
        # fail an SLO of exactly 0.1 that every replication meets).
        return Estimate(smallest, smallest, smallest, tuple(values), confidence)
    # The mean of values lies between them; rounding must not say otherwise.
    mean = min(max(math.fsum(values) / n, smallest), largest)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = t_quantile(confidence, n - 1) * math.sqrt(variance / n)
    return Estimate(mean, mean - half, mean + half, tuple(values), confidence)


def replications_to_decide(
    values: Sequence[float], threshold: float, confidence: float = 0.95
) -> int | None:
    """How many replications would likely put the interval on one side of ``threshold``.

    The interval's half-width is t(n - 1) * s / sqrt(n): assuming the mean and
    the standard deviation s stay as measured, it is the smallest n whose
    half-width is under the distance from the mean to ``threshold``. None
    when that distance is zero (no number would) or there is no spread yet
    (fewer than two distinct values: nothing to extrapolate from).
    """
    n = len(values)
    if n < 2 or min(values) == max(values):
        return None
    mean = math.fsum(values) / n
    distance = abs(mean - threshold)
    if distance == 0:
        return None
    deviation = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))

    def decides(m: int) -> bool:
        t = t_quantile(confidence, m - 1) if m - 1 <= _NORMAL_DF else _normal_quantile(confidence)
        return t * deviation / math.sqrt(m) < distance

    # The half-width shrinks as n grows: double past the answer, then bisect.
    high = 2
    while not decides(high):
        high *= 2
    low = high // 2  # does not decide (or is 1, which has no interval)
    while high - low > 1:
        middle = (low + high) // 2
        if decides(middle):
            high = middle
        else:
            low = middle
    return high


def _normal_quantile(confidence: float) -> float:
    # The two-sided normal quantile by bisection on erf: 1.95996 for 95%.
    low, high = 0.0, 40.0
    for _ in range(100):
        middle = (low + high) / 2
        if math.erf(middle / math.sqrt(2)) < confidence:
            low = middle
        else:
            high = middle
    return (low + high) / 2
