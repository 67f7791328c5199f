"""A trace read as a workload: what arrives when, and how each run went.

Arrivals are the trace's submits, skips (re-submitted with ``on_busy =
"skip"``), queued-run cancels and reloads, at their recorded times. How each
attempt of a run went — its duration and outcome, and the reset time of a
usage limit — comes from the recorded start/finish pair, or from
``duration``/``outcome`` on the submit line of a synthetic workload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import tomlkit

from herdsman.config import ConfigError, LoadedConfig, load_config_text
from herdsman.trace import OUTCOMES, TraceFormatError, TraceHeader, header_time, read_trace

__all__ = [
    "DEFAULT_DURATION",
    "Arrival",
    "Attempt",
    "Executions",
    "RunPlan",
    "Workload",
    "config_from_trace",
    "read_workload",
]


#: The longest a recorded start is taken to lag behind the event it answered.
START_LATENCY = 0.5

#: How long a run the recording never started takes when a what-if starts it.
DEFAULT_DURATION = 60.0


@attrs.frozen
class Attempt:
    """How one attempt of a run went: how long it took, and how it ended."""

    duration: float
    outcome: str
    exit_code: int | None = None
    #: For a usage-limited attempt: when the limit resets (unix seconds).
    resets_at: float | None = None


@attrs.define
class RunPlan:
    """A run's recorded attempts, in order; ``index`` is its arrival order.

    ``synthetic``: the attempts came from the submit line, not a recording.
    """

    index: int
    attempts: list[Attempt] = attrs.field(factory=list)
    synthetic: bool = False


@attrs.frozen
class Arrival:
    """Something that happens to the supervisor from outside, at time ``t``."""

    t: float
    kind: str  # submit | skip | cancel | reload | reload_rejected
    fields: Mapping[str, Any]


@attrs.frozen
class Workload:
    """A trace's header, arrivals (in order) and run plans."""

    header: TraceHeader
    started_at: float  # the header's time, unix seconds
    arrivals: tuple[Arrival, ...]
    plans: Mapping[str, RunPlan]


class Executions:
    """How each execution of a run goes, in order, from the workload's plans.

    Both simulation engines ask it once per execution, so they give a run the
    same attempt whatever else differs between them.
    """

    def __init__(self, workload: Workload) -> None:
        self._plans = workload.plans
        self._counts: dict[str, int] = {}
        #: Runs the recording never started, given DEFAULT_DURATION, in order.
        self.defaulted: list[str] = []
        self._defaulted: set[str] = set()  # membership only, never iterated

    def next(self, run_id: str) -> Attempt:
        """The attempt of ``run_id``'s next execution."""
        count = self._counts.get(run_id, 0)
        self._counts[run_id] = count + 1
        plan = self._plans.get(run_id)
        if plan is not None and count < len(plan.attempts):
            return plan.attempts[count]
        if plan is not None and plan.synthetic and plan.attempts:
            # A synthetic run tried again (after a usage limit) does its work
            # this time, in the time the workload gave it.
            return Attempt(plan.attempts[-1].duration, "succeeded", 0)
        if run_id not in self._defaulted:
            self._defaulted.add(run_id)
            self.defaulted.append(run_id)
        return Attempt(DEFAULT_DURATION, "succeeded", 0)


def read_workload(path: Path) -> Workload:
    """Read ``path`` (a trace) as a workload; :class:`TraceFormatError` if malformed."""
    header, events = read_trace(path)
    arrivals: list[Arrival] = []
    plans: dict[str, RunPlan] = {}
    started: dict[str, float] = {}
    resets: dict[str, float] = {}
    # The time of the last event a start can be a response to. A recorded
    # start comes a few milliseconds after what allowed it (the commit of the
    # start); timing each attempt from its cause, not from its start event,
    # makes a replay that starts it in response to the same event end it at
    # exactly the recorded moment, so those milliseconds never add up and
    # reorder events that were close.
    cause = 0.0
    for event in events:
        kind, fields = event.event, event.fields
        where = f"{path}:{event.line}"
        if kind != "start":
            cause = event.t
        if kind in ("submit", "skip"):
            run = fields["run"]
            submitted = plans.setdefault(run["id"], RunPlan(len(plans)))
            if "duration" in fields or "outcome" in fields:
                submitted.attempts.append(_synthetic(where, fields))
                submitted.synthetic = True
            arrivals.append(Arrival(event.t, kind, {"run": run}))
        elif kind == "start":
            # Longer after the last event than a start takes, it answered
            # something untraced (an account's rest ending): time it from itself.
            origin = cause if event.t - cause <= START_LATENCY else event.t
            started[fields["run_id"]] = origin
        elif kind == "usage_limit":
            resets[fields["run_id"]] = float(fields["until"])
        elif kind == "finish":
            run_id = fields["run_id"]
            began = started.pop(run_id, None)
            recorded = plans.get(run_id)
            if began is not None and recorded is not None:
                recorded.attempts.append(
                    Attempt(
                        round(event.t - began, 6),
                        fields["outcome"],
                        fields.get("exit_code"),
                        resets.pop(run_id, None),
                    )
                )
        elif kind == "cancel":
            arrivals.append(Arrival(event.t, kind, {"run_id": fields["run_id"]}))
        elif kind == "reload":
            # Checked now, so a bad one is an error naming its line, not a
            # failure half way through the replay.
            config_from_trace(fields["config"], where)
            arrivals.append(Arrival(event.t, kind, dict(fields)))
        elif kind in ("reload_rejected", "shutdown"):
            arrivals.append(Arrival(event.t, kind, dict(fields)))
    return Workload(header, header_time(header), tuple(arrivals), plans)


def _synthetic(where: str, fields: Mapping[str, Any]) -> Attempt:
    duration = fields.get("duration", 60.0)
    outcome = fields.get("outcome", "succeeded")
    if not isinstance(duration, int | float) or isinstance(duration, bool) or duration < 0:
        raise TraceFormatError(f"{where}: duration: expected seconds >= 0, got {duration!r}")
    if outcome not in OUTCOMES:
        raise TraceFormatError(
            f"{where}: outcome: expected one of {', '.join(OUTCOMES)}, got {outcome!r}"
        )
    return Attempt(float(duration), outcome)


def config_from_trace(
    config: Mapping[str, Any], name: str, overrides: Sequence[str] = ()
) -> LoadedConfig:
    """The configuration a trace header or reload event carries, validated again.

    ``name`` says where it came from in error messages (a bad one raises
    :class:`TraceFormatError` naming it and the key). ``null`` is "not set",
    except for the limits where it means "none", written ``"0"``.
    """
    text = tomlkit.dumps(_as_toml(config))
    try:
        return load_config_text(text, Path(name), overrides, environ={})
    except ConfigError as error:
        # Positions would point into TOML made from the JSON: name keys only.
        problems = "; ".join(
            f"{p.key_path}: {p.message}" if p.key_path else p.message for p in error.problems
        )
        raise TraceFormatError(f"{name}: config: {problems}") from None


#: Durations whose ``null`` means "no limit" ("0" in the file), not "default".
_NONE_IS_ZERO = frozenset({"timeout", "idle_timeout"})


def _as_toml(value: Any) -> Any:
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if item is None and key in _NONE_IS_ZERO:
                out[key] = "0"
            elif item is not None:
                out[key] = _as_toml(item)
        return out
    if isinstance(value, list):
        return [_as_toml(item) for item in value]
    return value
