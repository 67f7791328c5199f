"""``--slo``: a service-level objective a configuration must meet.

An SLO is one or more clauses joined by ``,`` (all must hold), each
``METRIC OP VALUE``: OP is ``<=``, ``<``, ``>=`` or ``>``; METRIC is one of
:data:`herdsman.sim.metrics.METRICS`. A wait takes seconds with an optional
unit (``60``, ``60s``, ``1.5m``, ``2h``); utilisation a fraction or a
percentage (``0.8``, ``80%``); throughput runs per hour; counts a number;
tokens a count (``500000``, ``500k``, ``3.1M``); spend US dollars (``50``,
``$50``, ``0.25``). Spend is what the agents burn (``spend_per_day``), not
what ``--cost`` prices (the configuration's cost a month).

A configuration meets a clause only when its whole confidence interval
does: the interval's upper end for ``<=``/``<``, its lower end for
``>=``/``>``. It misses the clause when its whole interval is on the wrong
side; otherwise the interval straddles the threshold and the clause is
undecided (more replications would narrow it). With one replication the
interval is the measured value, and every clause is decided.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Literal

import attrs

from herdsman.sim.metrics import METRICS
from herdsman.sim.stats import Estimate

__all__ = ["Clause", "Slo", "SloError", "Verdict", "parse_slo"]

#: What an interval says of a clause, or of a whole SLO.
Verdict = Literal["meets", "misses", "undecided"]

# The value may be empty, so that "p95_wait<=" is told its threshold is
# missing rather than read as "<" and a threshold of "=".
_CLAUSE = re.compile(r"\s*([a-z0-9_]+)\s*(<=|>=|<|>)\s*(\S*?)\s*")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}
_COMPARE: Mapping[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
}


class SloError(ValueError):
    """An ``--slo`` expression that is wrong."""


@attrs.frozen
class Clause:
    """``metric op value``, the value in the metric's own unit (seconds, fraction...)."""

    metric: str
    op: str
    value: float
    text: str

    def holds(self, estimate: Estimate) -> bool:
        """Whether the whole confidence interval of ``estimate`` meets the clause."""
        return self.verdict(estimate) == "meets"

    def verdict(self, estimate: Estimate) -> Verdict:
        """``meets`` (whole interval), ``misses`` (whole interval) or ``undecided``."""
        upper = self.op in ("<=", "<")
        near, far = (estimate.high, estimate.low) if upper else (estimate.low, estimate.high)
        if _COMPARE[self.op](near, self.value):
            return "meets"
        if not _COMPARE[self.op](far, self.value):
            return "misses"
        return "undecided"


@attrs.frozen
class Slo:
    """All clauses of an ``--slo``."""

    clauses: tuple[Clause, ...]
    text: str

    def met_by(self, estimates: Mapping[str, Estimate]) -> bool:
        """Whether every clause holds for these estimates."""
        return self.verdict(estimates) == "meets"

    def verdict(self, estimates: Mapping[str, Estimate]) -> Verdict:
        """``misses`` if a clause does, ``meets`` if all do, else ``undecided``."""
        verdicts = {clause.verdict(estimates[clause.metric]) for clause in self.clauses}
        if "misses" in verdicts:
            return "misses"
        return "undecided" if "undecided" in verdicts else "meets"

    @property
    def metric(self) -> str:
        """The SLO's metric: its first clause's (the one a plot draws)."""
        return self.clauses[0].metric


def parse_slo(text: str) -> Slo:
    """Parse ``--slo``; :class:`SloError` naming the clause and what would do."""
    clauses = []
    for part in text.split(","):
        match = _CLAUSE.fullmatch(part)
        if match is None:
            raise SloError(
                f"--slo: {part.strip()!r} is not METRIC OP VALUE, e.g. p95_wait<=60s"
                " (OP is <=, <, >= or >; clauses are joined by ',')"
            )
        metric, op, value = match.groups()
        if metric not in METRICS:
            raise SloError(f"--slo: unknown metric {metric!r}; expected one of {', '.join(METRICS)}"
                           + _spend_hint(metric))  # fmt: skip
        if not value:
            raise SloError(
                f"--slo: {part.strip()}: no threshold after {op}; write one, e.g."
                f" {metric}{op}{_example(metric)}"
            )
        clauses.append(Clause(metric, op, _value(metric, value, part.strip()), part.strip()))
    return Slo(tuple(clauses), text)


def _value(metric: str, text: str, clause: str) -> float:
    if metric.endswith("_wait"):
        match = re.fullmatch(r"(\d+(?:\.\d+)?)(s|m|h)?", text)
        if match is None:
            raise SloError(
                f"--slo: {clause}: expected a wait such as 60, 60s, 1.5m or 2h, got {text!r}"
            )
        # Exact decimal arithmetic, rounded once: 4.1m is 246 s, not 245.99999999999997.
        return float(Fraction(match[1]) * _UNITS[match[2] or ""])
    if metric == "utilisation":
        percent = text.endswith("%")
        number = _float(text[:-1] if percent else text)
        value = float(Fraction(text[:-1]) / 100) if percent and number is not None else number
        if value is None or not 0 <= value <= 1:
            raise SloError(
                f"--slo: {clause}: expected a utilisation from 0 to 1 or 0% to 100%, got {text!r}"
            )
        return value
    if metric.startswith("tokens_"):
        match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text)
        if match is None:
            raise SloError(
                f"--slo: {clause}: expected a token count such as 500000, 500k or 3.1M,"
                f" got {text!r}"
            )
        return float(Fraction(match[1]) * _TOKEN_UNITS[match[2].lower()])
    if metric.startswith("spend_"):
        number = _float(text.removeprefix("$"))
        if number is None or number < 0:
            raise SloError(
                f"--slo: {clause}: expected US dollars >= 0 such as 50 or $12.5, got {text!r}"
            )
        return number
    number = _float(text)
    if number is None or number < 0:
        raise SloError(f"--slo: {clause}: expected a number >= 0, got {text!r}")
    return number


_TOKEN_UNITS = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def _example(metric: str) -> str:
    """A threshold in ``metric``'s own unit, for a message."""
    if metric.endswith("_wait"):
        return "10m"
    if metric == "utilisation":
        return "80%"
    if metric.startswith("tokens_"):
        return "500k"
    if metric.startswith("spend_"):
        return "$50"
    return "2"


def _spend_hint(metric: str) -> str:
    """For a metric named after cost or dollars: the spend metric meant, and what cost is."""
    for prefix in ("cost_per_", "usd_per_", "dollars_per_"):
        if metric.startswith(prefix):
            meant = "spend_per_" + metric.removeprefix(prefix)
            meant = meant if meant in METRICS else "spend_per_day"
            return (
                f" (what the agents spend in dollars is {meant};"
                " --cost prices the configuration itself)"
            )
    return ""


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
