"""The synthetic-workload model behind ``herdsman sim generate``, and its flags.

A workload is conversations arriving over a ``span`` of time. Each
conversation picks a provider, has one or more turns (geometric, mean
``turns``), and each follow-up turn is submitted ``duration + think`` after the
turn before it (think time exponential, mean ``think``). Arrivals are Poisson
(optionally shaped by 24 hourly weights) or resampled from a recorded trace;
durations are exponential, lognormal, or resampled from a recorded trace.
docs/simulator.md describes the model; every flag is checked here, and a bad
one raises :class:`ModelError` naming the flag, the value and what would do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from herdsman.config.durations import parse_duration
from herdsman.sim.spend import FAILURE_CLASSES, TOKEN_KINDS

__all__ = [
    "MAX_TOKEN_SIGMA",
    "OUTCOME_SHARES",
    "Arrivals",
    "Durations",
    "Model",
    "ModelError",
    "PerKind",
    "TokenModel",
    "model_from_json",
    "model_to_json",
    "parse_arrivals",
    "parse_durations",
    "parse_number",
    "parse_profile",
    "parse_seconds",
    "parse_shares",
    "parse_week",
    "parse_weights",
]

#: Outcomes ``--outcomes`` may give a share of (the rest succeed).
OUTCOME_SHARES = ("failed", "timed_out")


#: The largest mean number of turns per conversation (a bound, so a typo
#: cannot make one conversation outlast the universe).
MAX_TURNS = 1000.0
#: The largest lognormal sigma accepted.
MAX_SIGMA = 10.0


class ModelError(ValueError):
    """A flag of ``sim generate`` (or a model in a trace header) that is wrong."""


#: The largest sigma of a run's token noise.
MAX_TOKEN_SIGMA = 5.0


@attrs.frozen
class PerKind:
    """A figure for each token kind: a mean count per run, or US dollars per million tokens."""

    input: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    output: float = 0.0


@attrs.frozen
class TokenModel:
    """A provider's tokens per run: each kind's mean, and the lognormal noise's sigma
    (``herdsman.sim.spend_model`` draws them)."""

    means: PerKind
    sigma: float = 0.0


@attrs.frozen
class Arrivals:
    """How conversations arrive: ``poisson`` (``rate`` per hour) or ``recorded`` (``trace``)."""

    kind: str
    rate: float = 0.0
    trace: str | None = None


@attrs.frozen
class Durations:
    """How long a run takes: ``exponential``, ``lognormal`` (mean, sigma) or ``empirical``."""

    kind: str
    mean: float = 0.0
    sigma: float = 0.0
    trace: str | None = None


@attrs.frozen
class Model:
    """Everything a generated workload is drawn from, besides the seed."""

    span: float
    arrivals: Arrivals
    durations: Durations
    #: Providers and their relative weights, in the order given.
    providers: tuple[tuple[str, float], ...]
    #: 24 hourly rate weights (mean 1) for Poisson arrivals, or None (flat).
    profile: tuple[float, ...] | None = None
    #: 7 daily rate weights (mean 1), Monday first, for Poisson arrivals, or None (flat).
    week: tuple[float, ...] | None = None
    turns: float = 1.0
    think: float = 300.0
    #: Share of runs ending ``failed`` / ``timed_out`` (the rest succeed).
    outcomes: tuple[tuple[str, float], ...] = ()
    #: Per provider, the share of runs whose first attempt hits the quota.
    usage_limited: tuple[tuple[str, float], ...] = ()
    started_at: str = "2026-11-30T00:00:00.000000Z"
    #: Per provider, the tokens its runs spend (a provider left out: none said).
    tokens: tuple[tuple[str, TokenModel], ...] = ()
    #: Per provider, US dollars per million tokens of each kind (left out: no cost said).
    prices: tuple[tuple[str, PerKind], ...] = ()
    #: Share of runs ending with each failure class (``herdsman.sim.spend.FAILURE_CLASSES``).
    failures: tuple[tuple[str, float], ...] = ()


def parse_seconds(flag: str, text: str, *, positive: bool = True) -> float:
    """A number of seconds (``90``, ``2.5``) or a duration string (``"5m"``, ``"1h30m"``)."""
    try:
        value = float(text)
    except ValueError:
        try:
            value = parse_duration(text).total_seconds()
        except ValueError:
            raise ModelError(
                f"{flag}: expected seconds (e.g. 90) or a duration such as 5m or 1h30m,"
                f" got {text!r}"
            ) from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise ModelError(f"{flag}: expected seconds {bound}, got {text!r}")
    return value


def parse_number(
    flag: str, what: str, text: str, *, low: float, high: float = math.inf, above: bool = False
) -> float:
    """``text`` as a number from ``low`` (excluded if ``above``) to ``high``.

    Raises :class:`ModelError` naming ``flag`` and ``what`` if it is not one.
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not low <= value <= high or (above and value == low):
        shown = f"a number > {low:g}" if above else f"a number >= {low:g}"
        if math.isfinite(high):
            shown = f"a number from {low:g} to {high:g}"
        raise ModelError(f"{flag}: {what}: expected {shown}, got {text!r}")
    return value


def parse_arrivals(text: str) -> Arrivals:
    """``poisson:RATE`` (conversations per hour) or ``recorded:TRACE``."""
    kind, colon, rest = text.partition(":")
    if kind == "poisson" and colon:
        what = "poisson rate (conversations per hour)"
        rate = parse_number("--arrivals", what, rest, low=0, above=True)
        return Arrivals("poisson", rate=rate)
    if kind == "recorded" and rest:
        return Arrivals("recorded", trace=rest)
    raise ModelError(
        f"--arrivals: expected poisson:RATE (conversations per hour, e.g. poisson:12)"
        f" or recorded:TRACE, got {text!r}"
    )


def parse_durations(text: str) -> Durations:
    """``exponential:MEAN``, ``lognormal:MEAN,SIGMA`` or ``empirical:TRACE``."""
    kind, colon, rest = text.partition(":")
    if kind == "exponential" and colon:
        return Durations(kind, mean=parse_seconds("--durations: exponential mean", rest))
    if kind == "lognormal" and colon:
        mean, comma, sigma = rest.partition(",")
        if not comma:
            raise ModelError(
                f"--durations: expected lognormal:MEAN,SIGMA (e.g. lognormal:5m,0.9), got {text!r}"
            )
        return Durations(
            kind,
            mean=parse_seconds("--durations: lognormal mean", mean),
            sigma=parse_number("--durations", "lognormal sigma", sigma, low=0, high=MAX_SIGMA),
        )
    if kind == "empirical" and rest:
        return Durations(kind, trace=rest)
    raise ModelError(
        "--durations: expected exponential:MEAN, lognormal:MEAN,SIGMA or empirical:TRACE"
        f" (MEAN in seconds or like 5m), got {text!r}"
    )


def parse_profile(text: str) -> tuple[float, ...]:
    """24 comma-separated hourly weights, scaled to a mean of 1."""
    parts = text.split(",")
    if len(parts) != 24:
        raise ModelError(
            f"--profile: expected 24 comma-separated hourly weights (hour 0 to 23),"
            f" got {len(parts)}"
        )
    weights = [
        parse_number("--profile", f"weight of hour {hour}", part.strip(), low=0)
        for hour, part in enumerate(parts)
    ]
    total = sum(weights)
    if total == 0:
        raise ModelError("--profile: at least one hourly weight must be > 0")
    return tuple(w * 24 / total for w in weights)


def parse_week(text: str) -> tuple[float, ...]:
    """7 comma-separated daily weights, Monday first, scaled to a mean of 1."""
    parts = text.split(",")
    if len(parts) != 7:
        raise ModelError(
            f"--week: expected 7 comma-separated daily weights (Monday to Sunday), got {len(parts)}"
        )
    weights = [
        parse_number("--week", f"weight of day {day}", part.strip(), low=0)
        for day, part in enumerate(parts, start=1)
    ]
    total = sum(weights)
    if total == 0:
        raise ModelError("--week: at least one daily weight must be > 0")
    return tuple(w * 7 / total for w in weights)


def parse_weights(flag: str, text: str, known: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``name=weight,name=weight`` over ``known`` names, weights > 0."""
    pairs = _pairs(flag, text, known, "weight")
    for name, weight in pairs:
        if weight <= 0:
            raise ModelError(f"{flag}: weight of {name}: expected a number > 0, got {weight:g}")
    return pairs


def parse_shares(flag: str, text: str, known: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``name=share,...`` over ``known`` names; shares from 0 to 1, adding up to at most 1."""
    pairs = _pairs(flag, text, known, "share")
    for name, share in pairs:
        if share > 1:
            raise ModelError(
                f"{flag}: share of {name}: expected a number from 0 to 1, got {share:g}"
            )
    if sum(share for _, share in pairs) > 1:
        raise ModelError(f"{flag}: the shares add up to more than 1")
    return pairs


def _pairs(flag: str, text: str, known: Sequence[str], what: str) -> tuple[tuple[str, float], ...]:
    out: list[tuple[str, float]] = []
    for item in text.split(","):
        name, equals, value = item.strip().partition("=")
        if not equals or not name:
            raise ModelError(
                f"{flag}: expected NAME={what.upper()}[,NAME={what.upper()}...], got {text!r}"
            )
        if name not in known:
            raise ModelError(f"{flag}: unknown name {name!r}; expected one of {', '.join(known)}")
        if any(name == seen for seen, _ in out):
            raise ModelError(f"{flag}: {name} is given twice")
        out.append((name, parse_number(flag, f"{what} of {name}", value, low=0)))
    return tuple(out)


def model_to_json(model: Model) -> dict[str, Any]:
    """The model as JSON, as a generated trace's header carries it."""
    value: dict[str, Any] = attrs.asdict(model, recurse=True)
    if value["week"] is None:
        del value["week"]  # a model without one reads as before it existed
    for name in ("tokens", "prices", "failures"):  # so too a model without spend
        if not value[name]:
            del value[name]
    return value


def model_from_json(value: Mapping[str, Any], where: str) -> Model:
    """Read back :func:`model_to_json`; :class:`ModelError` naming ``where`` if it is not one."""
    try:
        arrivals = Arrivals(**value["arrivals"])
        durations = Durations(**value["durations"])
        profile = value.get("profile")
        week = value.get("week")
        model = Model(
            span=float(value["span"]),
            arrivals=arrivals,
            durations=durations,
            providers=tuple((str(n), float(w)) for n, w in value["providers"]),
            profile=None if profile is None else tuple(float(w) for w in profile),
            week=None if week is None else tuple(float(w) for w in week),
            turns=float(value["turns"]),
            think=float(value["think"]),
            outcomes=tuple((str(n), float(s)) for n, s in value["outcomes"]),
            usage_limited=tuple((str(n), float(s)) for n, s in value["usage_limited"]),
            started_at=str(value["started_at"]),
            tokens=tuple(
                (str(n), TokenModel(_per_kind(t["means"]), float(t["sigma"])))
                for n, t in value.get("tokens", ())
            ),
            prices=tuple((str(n), _per_kind(p)) for n, p in value.get("prices", ())),
            failures=tuple((str(n), float(s)) for n, s in value.get("failures", ())),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise ModelError(f"{where}: generator.model: not a workload model ({error})") from None
    problem = _model_problem(model)
    if problem is not None:
        raise ModelError(f"{where}: generator.model.{problem}")
    return model


def _model_problem(model: Model) -> str | None:
    """What is wrong with a model read from a file (the flags check their own)."""

    def bad(value: float, low: float, high: float = math.inf, *, above: bool = False) -> bool:
        return not (math.isfinite(value) and low <= value <= high) or (above and value == low)

    if bad(model.span, 0, above=True):
        return f"span: expected seconds > 0, got {model.span!r}"
    arrivals, durations = model.arrivals, model.durations
    if arrivals.kind not in ("poisson", "recorded"):
        return f"arrivals.kind: expected poisson or recorded, got {arrivals.kind!r}"
    if arrivals.kind == "poisson" and bad(arrivals.rate, 0, above=True):
        return f"arrivals.rate: expected a number > 0, got {arrivals.rate!r}"
    if durations.kind not in ("exponential", "lognormal", "empirical"):
        return (
            f"durations.kind: expected exponential, lognormal or empirical, got {durations.kind!r}"
        )
    if durations.kind != "empirical" and bad(durations.mean, 0, above=True):
        return f"durations.mean: expected seconds > 0, got {durations.mean!r}"
    if durations.kind == "lognormal" and bad(durations.sigma, 0, MAX_SIGMA):
        return (
            f"durations.sigma: expected a number from 0 to {MAX_SIGMA:g}, got {durations.sigma!r}"
        )
    if arrivals.kind == "recorded" and not arrivals.trace:
        return "arrivals.trace: expected the path of a recorded trace"
    if durations.kind == "empirical" and not durations.trace:
        return "durations.trace: expected the path of a recorded trace"
    if bad(model.turns, 1, MAX_TURNS):
        return f"turns: expected a number from 1 to {MAX_TURNS:g}, got {model.turns!r}"
    if bad(model.think, 0):
        return f"think: expected seconds >= 0, got {model.think!r}"
    if not model.providers or any(bad(w, 0, above=True) for _, w in model.providers):
        return "providers: expected one or more providers with weights > 0"
    if model.profile is not None and (
        len(model.profile) != 24 or any(bad(w, 0) for w in model.profile) or not any(model.profile)
    ):
        return "profile: expected 24 hourly weights >= 0, at least one > 0"
    if model.week is not None and (
        len(model.week) != 7 or any(bad(w, 0) for w in model.week) or not any(model.week)
    ):
        return "week: expected 7 daily weights >= 0, at least one > 0"
    for name, shares in (("outcomes", model.outcomes), ("usage_limited", model.usage_limited)):
        if any(bad(share, 0, 1) for _, share in shares):
            return f"{name}: expected shares from 0 to 1"
    if sum(share for _, share in model.outcomes) > 1:
        return "outcomes: the shares add up to more than 1"
    return _spend_problem(model, bad)


def _per_kind(value: Mapping[str, Any]) -> PerKind:
    return PerKind(**{kind: float(value[kind]) for kind in TOKEN_KINDS})


def _spend_problem(model: Model, bad: Any) -> str | None:
    """What is wrong with the spend part of a model read from a file, if anything."""
    for name, tokens in model.tokens:
        means = attrs.astuple(tokens.means)
        if any(bad(v, 0) for v in means) or not any(means) or bad(tokens.sigma, 0, MAX_TOKEN_SIGMA):
            return (
                f"tokens: {name}: expected means >= 0, one > 0, and a sigma from 0 to"
                f" {MAX_TOKEN_SIGMA:g}"
            )
    modelled = {name for name, _ in model.tokens}
    for name, prices in model.prices:
        if name not in modelled or any(bad(v, 0) for v in attrs.astuple(prices)):
            return f"prices: {name}: expected prices >= 0, of a provider with tokens"
    if any(name not in FAILURE_CLASSES or bad(share, 0, 1) for name, share in model.failures):
        return f"failures: expected shares from 0 to 1 of {', '.join(FAILURE_CLASSES)}"
    if sum(share for _, share in (*model.outcomes, *model.failures)) > 1:
        return "outcomes and failures: the shares add up to more than 1"
    return None
