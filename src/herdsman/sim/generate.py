"""Draw a synthetic trace from a workload model and a seed (``herdsman sim generate``).

Every random number comes from one ``random.Random(seed)``, drawn in a fixed
order (all conversation arrivals first, then each conversation's turns in
arrival order), and events are sorted by ``(time, run number)``: the same
model, configuration and seed give the same bytes in any process.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from herdsman.sim.model import Model, ModelError, model_to_json
from herdsman.sim.spend import ENDINGS
from herdsman.sim.spend_model import draw_spend
from herdsman.sim.workload import Workload, read_workload, workload_from_events
from herdsman.trace import TRACE_VERSION, TraceEvent, TraceHeader

__all__ = [
    "Samples",
    "generate",
    "generate_workload",
    "load_samples",
    "recorded_durations",
    "recorded_gaps",
]

#: Outcomes of recorded attempts whose duration is the time the work took
#: (a cancelled or usage-limited attempt was cut short).
_WORKED = frozenset({"succeeded", "failed", "timed_out"})


@attrs.frozen
class Samples:
    """What recorded traces supply: gaps between conversation arrivals, durations."""

    gaps: tuple[float, ...] = ()
    durations: tuple[float, ...] = ()


def recorded_gaps(workload: Workload, name: str) -> tuple[float, ...]:
    """Seconds between consecutive conversations' first submits in ``workload``.

    A run without a conversation is a conversation of its own.
    """
    firsts: dict[tuple[str, str], float] = {}
    for arrival in workload.arrivals:
        if arrival.kind not in ("submit", "skip"):
            continue
        run = arrival.fields["run"]
        conversation = run.get("conversation")
        key = (run.get("workspace") or "default", conversation) if conversation else ("", run["id"])
        firsts.setdefault(key, arrival.t)
    times = list(firsts.values())
    gaps = tuple(round(b - a, 6) for a, b in itertools.pairwise(times))
    if not gaps or sum(gaps) <= 0:
        raise ModelError(
            f"--arrivals: {name}: resampling arrivals needs at least two conversations"
            f" starting at different times; the trace has {len(times)}"
        )
    return gaps


def recorded_durations(workload: Workload, name: str) -> tuple[float, ...]:
    """Durations of the attempts in ``workload`` that did their work."""
    durations = tuple(
        attempt.duration
        for plan in workload.plans.values()
        for attempt in plan.attempts
        if attempt.outcome in _WORKED
    )
    if not durations:
        raise ModelError(
            f"--durations: {name}: no run in the trace has a duration to resample"
            " (no succeeded, failed or timed-out run)"
        )
    return durations


def load_samples(model: Model) -> Samples:
    """Read the recorded traces ``model`` resamples (TraceFormatError if malformed)."""
    gaps: tuple[float, ...] = ()
    durations: tuple[float, ...] = ()
    if model.arrivals.trace is not None:
        gaps = recorded_gaps(read_workload(Path(model.arrivals.trace)), model.arrivals.trace)
    if model.durations.trace is not None:
        durations = recorded_durations(
            read_workload(Path(model.durations.trace)), model.durations.trace
        )
    return Samples(gaps, durations)


def generate(model: Model, config: Mapping[str, Any], seed: int, samples: Samples) -> str:
    """The trace text of a workload drawn from ``model`` with ``seed``, under ``config``."""
    header, events = _draw(model, config, seed, samples)
    lines = [_dumps(header)]
    lines += [
        _dumps({"t": t, "seq": seq, "event": "submit", **fields})
        for seq, (t, fields) in enumerate(events)
    ]
    return "\n".join(lines) + "\n"


def generate_workload(
    model: Model, config: Mapping[str, Any], seed: int, samples: Samples, name: str
) -> Workload:
    """The workload :func:`generate`'s text reads as, drawn without writing it out.

    A plan builds each replication this way: the same header and submit
    lines (a test compares the two for many models), without the JSON that
    a file needs and the checks that a file a person may have edited
    needs. ``name`` stands for the file in messages.
    """
    header, events = _draw(model, config, seed, samples)
    # The one header line is read back as written, so its values have JSON's
    # types (lists, not the model's tuples) as they would from the file.
    line = json.loads(_dumps(header))
    read = TraceHeader(TRACE_VERSION, line["started_at"], line["config"], None, line["generator"])
    # Line 1 is the header: event number n is on line n + 2.
    lines = (
        TraceEvent(t, seq, "submit", fields, seq + 2) for seq, (t, fields) in enumerate(events)
    )
    return workload_from_events(read, lines, name)


def _draw(
    model: Model, config: Mapping[str, Any], seed: int, samples: Samples
) -> tuple[dict[str, Any], list[tuple[float, dict[str, Any]]]]:
    """The header line, and each submit's time and other fields in trace order."""
    rng = random.Random(seed)
    starts = _conversation_starts(model, samples, rng)
    names = [name for name, _ in model.providers]
    weights = [weight for _, weight in model.providers]
    limited = dict(model.usage_limited)
    tokens, prices = dict(model.tokens), dict(model.prices)
    mean_duration = _mean_duration(model, samples) if tokens else 0.0
    events: list[tuple[float, int, dict[str, Any]]] = []
    for number, start in enumerate(starts):
        provider = rng.choices(names, weights)[0]
        t = start
        for _turn in range(_turns(model.turns, rng)):
            duration = round(_duration(model, samples, rng), 3)
            index = len(events)
            outcome, failure = _outcome(model, limited.get(provider, 0.0), rng)
            fields: dict[str, Any] = {
                "run": {
                    "id": f"r{index:06d}",
                    "provider": provider,
                    "conversation": f"c{number:05d}",
                },
                "duration": duration,
                "outcome": outcome,
            }
            if failure is not None:
                fields["failure"] = failure
            spends = tokens.get(provider)
            if spends is not None:
                fields["spend"] = draw_spend(
                    spends, prices.get(provider), duration, mean_duration, rng
                )
            events.append((round(t, 6), index, fields))
            think = rng.expovariate(1 / model.think) if model.think > 0 else 0.0
            t += duration + think
    events.sort(key=lambda item: (item[0], item[1]))
    header = {
        "herdsman_trace": TRACE_VERSION,
        "started_at": model.started_at,
        "config": config,
        "generator": {"seed": seed, "model": model_to_json(model)},
    }
    return header, [(t, fields) for t, _, fields in events]


def _dumps(obj: Mapping[str, Any]) -> str:
    # As the trace writer does: compact, insertion order, so equal means equal bytes.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _conversation_starts(model: Model, samples: Samples, rng: random.Random) -> list[float]:
    starts: list[float] = []
    t = 0.0
    if model.arrivals.kind == "recorded":
        while True:
            t += rng.choice(samples.gaps)
            if t >= model.span:
                return starts
            starts.append(t)
    # Poisson with a rate varying by hour and by day of the week: thinning
    # (Lewis and Shedler) — candidates at the peak rate, each kept with
    # probability rate(t) / peak.
    profile, week = model.profile, model.week
    peak = (max(profile) if profile is not None else 1.0) * (max(week) if week else 1.0)
    rate = model.arrivals.rate * peak / 3600
    offset = _seconds_into_week(model.started_at)
    while True:
        t += rng.expovariate(rate)
        if t >= model.span:
            return starts
        if profile is not None or week is not None:
            moment = (offset + t) % (7 * 86400)
            weight = profile[int(moment % 86400 // 3600)] if profile is not None else 1.0
            if week is not None:
                weight *= week[int(moment // 86400)]
            if rng.random() * peak >= weight:
                continue
        starts.append(t)


def _seconds_into_week(started_at: str) -> float:
    """Seconds since the Monday 00:00 UTC before ``started_at``."""
    when = dt.datetime.fromisoformat(started_at.replace("Z", "+00:00")).astimezone(dt.UTC)
    day = when.weekday() * 86400
    return day + when.hour * 3600 + when.minute * 60 + when.second + when.microsecond / 1e6


def _turns(mean: float, rng: random.Random) -> int:
    # Geometric on 1, 2, ...: another turn follows with probability 1 - 1/mean.
    turns = 1
    while rng.random() >= 1 / mean:
        turns += 1
    return turns


def _duration(model: Model, samples: Samples, rng: random.Random) -> float:
    durations = model.durations
    if durations.kind == "exponential":
        return rng.expovariate(1 / durations.mean)
    if durations.kind == "lognormal":
        # mu chosen so the distribution's mean (not its median) is ``mean``.
        mu = math.log(durations.mean) - durations.sigma**2 / 2
        return rng.lognormvariate(mu, durations.sigma)
    return rng.choice(samples.durations)


def _mean_duration(model: Model, samples: Samples) -> float:
    """The mean of the durations ``model`` draws: a run this long spends the mean tokens."""
    if model.durations.kind == "empirical":
        return math.fsum(samples.durations) / len(samples.durations)
    return model.durations.mean


def _outcome(model: Model, limited: float, rng: random.Random) -> tuple[str, str | None]:
    """A run's outcome, and its failure class if it has one: one draw for both
    (so a model without failure classes draws as it did before they existed)."""
    if limited > 0 and rng.random() < limited:
        return "usage_limited", None
    if model.outcomes or model.failures:
        draw = rng.random()
        for outcome, share in model.outcomes:
            if draw < share:
                return outcome, None
            draw -= share
        for failure, share in model.failures:
            if draw < share:
                return ENDINGS[failure].outcome, failure
            draw -= share
    return "succeeded", None
