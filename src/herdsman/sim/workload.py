"""A trace read as a workload: what arrives when, and how each run went.

Arrivals are the trace's submits, skips (re-submitted with ``on_busy =
"skip"``), queued-run cancels and reloads, and the beginnings of submits'
waits for a sweep's removal (``removal_wait``), at their recorded times,
after the runs a rotated file's header carries over. How each
attempt of a run went — its duration and outcome, and the reset time of a
usage limit — comes from the recorded start/finish pair, or from
``duration``/``outcome`` on the submit line of a synthetic workload.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import tomlkit

from herdsman.config import ConfigError, LoadedConfig, load_config_text
from herdsman.core.runs import DEFAULT_WORKSPACE, RunRequest
from herdsman.runtime.runner.api_failure import ApiFailure
from herdsman.runtime.runner.run_usage import RunUsage
from herdsman.sim.recorded_end import SIGNALS as _SIGNALS
from herdsman.sim.recorded_end import (
    TICK,
    Reported,
    Signals,
    after_finish,
    note,
    recorded_end,
)
from herdsman.sim.spend import read_failure, usage_of
from herdsman.trace import (
    OUTCOMES,
    TraceEvent,
    TraceFormatError,
    TraceHeader,
    header_time,
    read_trace,
    read_trace_text,
)

__all__ = [
    "DEFAULT_DURATION",
    "Arrival",
    "Attempt",
    "Ending",
    "Executions",
    "RecordedAttempt",
    "RunPlan",
    "Workload",
    "config_from_trace",
    "held_to",
    "late_wake",
    "read_workload",
    "read_workload_text",
    "workload_from_events",
]


#: The message of an account rest a rotated trace file carried over.
CARRIED_REST = "usage limit (before this trace file)"

#: The longest a recorded start is taken to lag behind the event it answered.
START_LATENCY = 0.5

#: How long a run the recording never started takes when a what-if starts it.
DEFAULT_DURATION = 60.0


#: How an attempt ends, as far as an end shared with attempts ending alike goes:
#: outcome, exit code, and the usage limit's reset.
Ending = tuple[str, int | None, float | None]


def _shared_end(attempt: Attempt) -> Ending | None:
    if attempt.usage is not None or attempt.limit is not None or attempt.reported is not None:
        return None
    return (attempt.outcome, attempt.exit_code, attempt.resets_at)


@attrs.frozen
class Attempt:
    """How one attempt of a run went: how long it took, and how it ended.

    ``shared_end``: the key under which its end is shared with every attempt
    ending alike, or None if its end is its own. The fake runner shares one
    outcome between attempts that end with the same outcome, exit code and
    reset (most of them); one whose stream said more (a spend, a failure
    class, work done, a message) gets its own. Worked out when the attempt
    is made, with the workload, as an arrival's derived fields are: both
    engines ask at every start, and a plan simulates one workload under
    every configuration of its sweep.
    """

    duration: float
    outcome: str
    exit_code: int | None = None
    #: For a usage-limited attempt: when the limit resets (unix seconds).
    resets_at: float | None = None
    #: What the agent's stream says (a synthetic run's spend and failure
    #: class, as the runner hands them on); None: nothing.
    usage: RunUsage | None = None
    #: The runner's word on a timed-out attempt: the limit that fired.
    limit: str | None = None
    #: What a recorded attempt's agent did beyond that: work before it
    #: failed (a retry policy's ``after_work`` decides whether such an attempt
    #: is retried), the runner's reason (a refused login's message), a
    #: session (its conversation sticks to the account); None: none of it.
    reported: Reported | None = None
    shared_end: Ending | None = attrs.field(
        init=False, eq=False, repr=False, default=attrs.Factory(_shared_end, takes_self=True)
    )

    def end(self, now: float) -> float:
        """When the attempt ends if it starts at ``now`` (trace time); both engines ask."""
        return now + self.duration


@attrs.frozen
class RecordedAttempt(Attempt):
    """An attempt a trace recorded: when its ``finish`` was traced, and when it may start.

    A start at a moment after ``answers_after`` and up to ``answers_by``
    (the recorded start) may answer the event the recorded start answered
    (see :func:`_answered`): started then, the attempt ends at ``ends_at``
    exactly, whichever of those events the engine started it on, so a replay
    that agrees with the recording so far ends it where the recording did.
    Started at any other moment (a what-if), it takes ``duration``. A class
    of its own, so synthetic attempts (most of a plan's) cost no more to make.
    """

    ends_at: float = attrs.field(kw_only=True)
    answers_after: float = attrs.field(kw_only=True)
    answers_by: float = attrs.field(kw_only=True)

    def end(self, now: float) -> float:
        """When the attempt ends if it starts at ``now`` (trace time)."""
        if self.answers_after < now <= self.answers_by:
            return self.ends_at
        return now + self.duration


@attrs.define
class RunPlan:
    """A run's recorded attempts, in order; ``index`` is its arrival order.

    ``synthetic``: the attempts came from the submit line, not a recording.
    ``usage``: for a synthetic run with a spend, what each attempt after the
    first spends (the line's spend; a first attempt refused at a usage limit
    or at its login spends nothing).
    """

    index: int
    attempts: list[Attempt] = attrs.field(factory=list)
    synthetic: bool = False
    usage: RunUsage | None = None


def _request_of(arrival: Arrival) -> RunRequest | None:
    """A submit's, a skip's or a removal wait's run, as the scheduler sees it (else None)."""
    run = arrival.fields.get("run") if arrival.kind in ("submit", "skip", "removal_wait") else None
    if run is None:  # a removal wait is given its run once paired with its submit
        return None
    return RunRequest(
        id=run["id"],
        provider=run["provider"],
        conversation=run.get("conversation"),
        agent=run.get("agent"),
        workspace=run.get("workspace", DEFAULT_WORKSPACE),
        cwd=run.get("cwd"),
    )


def _trace_t(arrival: Arrival) -> float:
    return round(arrival.t, 6)


@attrs.frozen
class Arrival:
    """Something that happens to the supervisor from outside, at time ``t``.

    What an engine derives from an arrival alone is worked out when the
    arrival is made, with the workload: a plan simulates one workload under
    every configuration of its sweep. ``request``: a submit's, a skip's or a
    removal wait's run as the scheduler sees it (None for other arrivals); ``trace_t``:
    ``t`` as a trace records an event at that moment (rounded to the
    microsecond).
    """

    t: float
    # submit | skip | cancel | reload | reload_rejected | shutdown | rest | rest_ended
    # | removal_wait (its run's submit waits for a sweep's removal; ``run`` added)
    kind: str
    fields: Mapping[str, Any]
    request: RunRequest | None = attrs.field(
        init=False, eq=False, repr=False, default=attrs.Factory(_request_of, takes_self=True)
    )
    trace_t: float = attrs.field(
        init=False, eq=False, repr=False, default=attrs.Factory(_trace_t, takes_self=True)
    )


def _kinds(workload: Workload) -> frozenset[str]:
    return frozenset(arrival.kind for arrival in workload.arrivals)


@attrs.frozen
class Workload:
    """A trace's header, arrivals (in order) and run plans.

    ``kinds``: the kinds of its arrivals (membership only), worked out when
    the workload is made: an engine asks at the start of every simulation
    (a workload with reloads needs a ledger), and a plan simulates one
    workload under every configuration of its sweep.
    """

    header: TraceHeader
    started_at: float  # the header's time, unix seconds
    arrivals: tuple[Arrival, ...]
    plans: Mapping[str, RunPlan]
    #: When the recording went on in another file (the trace was rotated).
    rotated_at: float | None = None
    #: Runs the recorded supervisor found running when it started (their
    #: process had stopped without recording them): it recorded them lost.
    lost: tuple[str, ...] = ()
    #: When the recording ends without a shutdown or a rotation (the
    #: supervisor was killed, or the file was read while it ran), if runs
    #: were still running then: they never end in a replay either.
    cut_at: float | None = None
    #: Submits that waited for a sweep's removal but are not held by a
    #: replay, with when they began to wait: another submit to their
    #: conversation came meanwhile (see ``_waits_with_their_runs``).
    unheld: tuple[tuple[str, float], ...] = ()
    #: Failed attempts whose finish names no failure class (and no retry or
    #: refused login says one), with its time: the replay retries none of
    #: them, whatever the policy (see ``summary``).
    unclassed: tuple[tuple[str, float], ...] = ()
    #: When the recorded dispatcher decided the starts whose line says so
    #: (``decided``), in order: a replay's timer due shortly before one of
    #: them, with nothing else between, fires then (see :func:`late_wake`).
    wakes: tuple[float, ...] = ()
    kinds: frozenset[str] = attrs.field(
        init=False, eq=False, repr=False, default=attrs.Factory(_kinds, takes_self=True)
    )

    @property
    def predates_retries(self) -> bool:
        """Whether the recording's supervisor had no retry policies (its providers name none)."""
        providers = self.header.config.get("providers") or {}
        return bool(providers) and all(
            not isinstance(settings, Mapping) or "retry" not in settings
            for settings in providers.values()
        )


class Executions:
    """How each execution of a run goes, in order, from the workload's plans.

    Both simulation engines ask it once per execution, so they give a run the
    same attempt whatever else differs between them.
    """

    def __init__(self, workload: Workload) -> None:
        self._plans = workload.plans
        self._counts: dict[str, int] = {}
        self._defaulted: set[str] = set()  # membership only, never iterated

    def next(self, run_id: str) -> Attempt:
        """The attempt of ``run_id``'s next execution."""
        count = self._counts.get(run_id, 0)
        self._counts[run_id] = count + 1
        return self.attempt(run_id, self._plans.get(run_id), count)

    def attempt(self, run_id: str, plan: RunPlan | None, count: int) -> Attempt:
        """The attempt of ``run_id``'s execution after ``count`` earlier ones, given its plan.

        For an engine that counts a run's executions itself (and has its
        plan at hand) rather than through :meth:`next`.
        """
        if plan is not None and count < len(plan.attempts):
            return plan.attempts[count]
        if plan is not None and plan.synthetic and plan.attempts:
            # A synthetic run tried again (a retry, or after a usage limit or
            # a refused login) does its work this time, in the time the
            # workload gave it, spending what it gave.
            return Attempt(plan.attempts[-1].duration, "succeeded", 0, usage=plan.usage)
        self._defaulted.add(run_id)
        return Attempt(DEFAULT_DURATION, "succeeded", 0)

    @property
    def defaulted(self) -> list[str]:
        """Runs the recording never started, given DEFAULT_DURATION, in arrival order
        (not in the order they started: under trio that is the tasks' wake order)."""
        last = len(self._plans)
        return sorted(
            self._defaulted,
            key=lambda run_id: (
                self._plans[run_id].index if run_id in self._plans else last,
                run_id,
            ),
        )


def read_workload(path: Path) -> Workload:
    """Read ``path`` (a trace) as a workload; :class:`TraceFormatError` if malformed."""
    header, events = read_trace(path)
    return _workload(header, events, str(path))


def read_workload_text(text: str, name: str) -> Workload:
    """:func:`read_workload` for a trace held in memory; ``name`` stands for the file."""
    header, events = read_trace_text(text, name)
    return _workload(header, events, name)


def workload_from_events(header: TraceHeader, events: Iterable[TraceEvent], name: str) -> Workload:
    """The workload of a trace already read: its header and events, in order.

    For a trace drawn in memory (``sim generate``'s model) rather than read
    from a file; ``name`` stands for the file in messages.
    """
    return _workload(header, events, name)


def _workload(header: TraceHeader, events: Iterable[TraceEvent], path: str) -> Workload:
    arrivals: list[Arrival] = []
    plans: dict[str, RunPlan] = {}
    # run id -> (origin of its duration, the moments its start answers)
    started: dict[str, tuple[float, float, float]] = {}
    # What the events just before a run's finish said of its attempt.
    signals: dict[str, Signals] = {}
    # The time of the last event a start can be a response to, of the last
    # start before that event, and of the last event that may have let a
    # queued run start: not a submit, which lets only its own run start
    # (see _answered).
    cause, floor, last_start, freed = 0.0, -math.inf, -math.inf, 0.0
    # When a replay that agrees meets the events so far (see _Met), and the
    # header's time: see after_finish.
    met, started_at, ends = _Met(), header_time(header), _PlainEnds(plans)
    rotated_at = None
    lost: list[str] = []  # runs the recorded supervisor found lost as it started
    last_t = 0.0
    unclassed: list[tuple[str, float]] = []  # see Workload.unclassed
    wakes: list[float] = []  # see Workload.wakes
    first: dict[str, float] = {}  # when each run's first start was decided, if said
    _carried(header, arrivals, plans, started)
    for event in events:
        kind, fields, last_t = event.event, event.fields, event.t
        where = f"{path}:{event.line}"
        if kind not in ("start", "removal_wait"):  # a wait for a removal starts nothing
            cause, floor = event.t, last_start
            freed = freed if kind in ("submit", "skip") else event.t
        if kind in ("submit", "skip"):
            run = fields["run"]
            submitted = plans.setdefault(run["id"], RunPlan(len(plans)))
            if "duration" in fields or "outcome" in fields or _described(fields):
                _add_synthetic(submitted, where, fields)
            arrivals.append(Arrival(event.t, kind, {"run": run}))
        elif kind == "start":
            run_id = fields["run_id"]
            # A retried run's next start may answer the end of its backoff.
            started[run_id] = _answered(
                cause,
                floor,
                event.t,
                ends.ahead_of(signals, run_id),
                earliest=freed,
                decided=(
                    _decided(run_id, fields["decided"], wakes, first, plans)
                    if "decided" in fields
                    else None
                ),
            )
            last_start = event.t
            met.meet(kind, started[run_id][0])
        elif kind in _SIGNALS:
            note(signals.setdefault(fields["run_id"], Signals()), kind, fields)
        elif kind == "finish":
            run_id = fields["run_id"]
            # An attempt ends when the supervisor read its end (its ended,
            # or a retry's), a little before its finish was traced: what its
            # end lets start answers that moment, though a start traced
            # ahead of the finish may have been committed after it.
            said, cause = after_finish(
                signals,
                run_id,
                event.t,
                started_at,
                met.before,
                read=fields.get("ended"),
                settled=met.settled,
            )
            floor, freed = min(floor, round(cause - TICK, 6)), cause
            if _add_recorded(
                plans.get(run_id),
                started.pop(run_id, None),
                event,
                where=where,
                said=said,
                end=cause,
                ends=ends,
                before=met.before,
            ):
                unclassed.append((run_id, event.t))
        elif kind == "reload":
            # Checked now, so a bad one is an error naming its line, not a
            # failure half way through the replay.
            config_from_trace(fields["config"], where)
            arrivals.append(Arrival(event.t, kind, dict(fields)))
        elif kind in ("cancel", "reload_rejected", "shutdown", "rest_ended", "removal_wait"):
            arrivals.append(Arrival(event.t, kind, dict(fields)))
        elif kind == "rotated":
            rotated_at = event.t
        elif kind == "lost" and not arrivals:
            # Found at the start: the supervisor before this one stopped
            # without recording them (a lease expiry later on is a fleet's).
            lost.append(fields["run_id"])
        if kind not in _SIGNALS and kind != "start":
            met.meet(kind, cause if kind == "finish" else event.t)
    cut_at = _still_running(started, plans, rotated_at, arrivals, last_t)
    return _waits_with_their_runs(
        Workload(
            header,
            header_time(header),
            _held_to_decision(arrivals, first) if wakes else tuple(arrivals),
            plans,
            rotated_at,
            tuple(lost),
            cut_at,
            unclassed=tuple(unclassed),
            # Sorted: starts are traced in commit order, not decision order.
            wakes=tuple(sorted(wakes)),
        )
    )


def _decided(
    run_id: str,
    decided: float,
    wakes: list[float],
    first: dict[str, float],
    plans: Mapping[str, RunPlan],
) -> float:
    """A start's ``decided``, noted in ``wakes``, and in ``first`` if its run's first start."""
    wakes.append(decided)
    plan = plans.get(run_id)
    if plan is None or not plan.attempts:
        first.setdefault(run_id, decided)
    return decided


def _held_to_decision(
    arrivals: Sequence[Arrival], decided: Mapping[str, float]
) -> tuple[Arrival, ...]:
    """``arrivals`` with each submit whose run's first start was decided late delivered then.

    A submit is traced as its commit ends; the submitting task decides its
    run's start when it resumes, under load tens of milliseconds later,
    unless a finish read meanwhile decided it first (with the starts that
    finish allowed, in queue order). A replay would decide at the submit,
    before that finish. Delivered at its start's ``decided`` (at most
    ``START_LATENCY`` later, and only if no other arrival comes between, so
    that runs keep their order), the run is queued when the recorded
    dispatcher took it. Ends due at that moment go first, as recorded.
    """
    held = list(arrivals)
    for n, arrival in enumerate(held):
        if arrival.kind != "submit":
            continue
        at = decided.get(arrival.fields["run"]["id"])
        if at is not None:
            following = held[n + 1].t if n + 1 < len(held) else math.inf
            moment = held_to(arrival.t, at, following)
            if moment != arrival.t:
                held[n] = Arrival(moment, arrival.kind, arrival.fields)
    return tuple(held)


def held_to(t: float, decided: float, following: float) -> float:
    """When a replay delivers an input traced at ``t`` whose run's start the recorded
    supervisor decided at ``decided``: then, if that is at most ``START_LATENCY``
    later and the next input (at ``following``) does not come between; else at ``t``.

    The one rule of a replay's hold, for a lone supervisor's submits
    (:func:`_held_to_decision`) and a fleet member's polls alike.
    """
    return decided if t < decided <= t + START_LATENCY and following >= decided else t


def late_wake(wakes: Sequence[float], due: float, before: float) -> float:
    """When a replay's timer due at ``due`` fires: at the first of ``wakes`` from then on
    if it comes by ``before`` (the next event) and within ``START_LATENCY``, else ``due``.

    The recorded supervisor's timer (the end of a retry's backoff, an
    account's rest) fired late under load, and its dispatcher decided then,
    with whatever else had become startable meanwhile; a start's
    ``decided`` says when. A replay's timer is on time: it would decide
    with less. Nothing else happens between, so firing it then changes
    nothing but the decision's moment.
    """
    at = bisect.bisect_left(wakes, due)
    if at < len(wakes):
        wake = wakes[at]
        if wake <= before and wake - due <= START_LATENCY:
            return wake
    return due


@attrs.define
class _Met:
    """When a replay that agrees with the recording meets the events read so far.

    Signals aside: a finish at its attempt's end, a start with what it
    answered (the origin of its duration), anything else at its time.
    ``before``: the last of them; ``settled``: the last but those traced
    once their commit ended that queue runs only then, which a finish's own
    reading of its end (its ``ended``) may come before (see ``read_at``).
    """

    before: float = -math.inf
    settled: float = -math.inf

    def meet(self, kind: str, t: float) -> None:
        """An event of ``kind`` met at ``t``."""
        self.before = max(self.before, t)
        if kind not in _QUEUED_AT_COMMIT:
            self.settled = max(self.settled, t)


def _add_recorded(
    plan: RunPlan | None,
    began: tuple[float, float, float] | None,
    event: TraceEvent,
    *,
    where: str,
    said: Signals,
    end: float,
    ends: _PlainEnds,
    before: float,
) -> bool:
    """Give ``plan`` the attempt ``event`` (a finish) ended at ``end``, begun as ``began`` says.

    Nothing if the run or its start is not in the recording. Whether the
    attempt failed with a class the trace does not say (see :func:`_unclassed`).
    """
    if began is None or plan is None:
        return False
    plan.attempts.append(_recorded(where, end, event.fields, said, began))
    ends.add(event.t, event.fields["run_id"], said, before)
    return _unclassed(event.fields, said)


class _PlainEnds:
    """The finishes read so far that no retry followed, to end ahead of a backoff's start.

    Under load the recorded supervisor met the end of a run's backoff late:
    its timer fired tens of milliseconds after it was due, and another run's
    finish, traced meanwhile, came before the retried run's start. The
    replay starts that run when its backoff ends, on time; to keep the
    recorded order it ends such a finish just before then, as an on-time
    supervisor would have traced it had it read that end by then. Never
    before the replay meets the event traced ahead of that finish (then it
    keeps its time, and the replay may start the run first).

    A trace whose finishes say when their end was read (``ended``) and
    whose starts when they were decided (``decided``) still needs it: such
    an end read after the backoff ended, before the late timer fired, let
    its own dispatch start the retried run (``decided`` equal to the
    finish's ``ended``). The replay's timer, due at the backoff's end and
    moved to that moment at most (``late_wake``), acts before a run's end
    due then, and would start the run ahead of the finish. An ``ended``
    before the backoff's end is never moved (``ends_at`` is already there).
    """

    def __init__(self, plans: Mapping[str, RunPlan]) -> None:
        self._plans = plans
        # (trace time, run, its attempt's index, when the replay meets the event before it)
        self._ends: list[tuple[float, str, int, float]] = []

    def add(self, t: float, run_id: str, said: Signals, before: float) -> None:
        """A finish traced at ``t`` whose attempt was just added to its run's plan."""
        if said.retried is None:  # a retried end has its own moment (ended_at)
            self._ends.append((t, run_id, len(self._plans[run_id].attempts) - 1, before))

    def ahead_of(self, signals: Mapping[str, Signals], run_id: str) -> float | None:
        """For the start of ``run_id`` just read: when its backoff ended, if it was retried.

        The finishes traced since then end just before it.
        """
        backoff = signals[run_id].backoff_until if run_id in signals else None
        if backoff is None:
            return None
        end = round(backoff - BACKOFF_SLACK, 6)
        for traced, other, index, before in reversed(self._ends):
            if traced <= end:
                break
            attempt = self._plans[other].attempts[index]
            if (
                isinstance(attempt, RecordedAttempt)
                and before < end - BACKOFF_SLACK
                and attempt.ends_at > end
            ):
                early = attempt.ends_at - end
                self._plans[other].attempts[index] = attrs.evolve(
                    attempt, duration=round(attempt.duration - early, 6), ends_at=end
                )
        return backoff


def _unclassed(fields: Mapping[str, Any], said: Signals) -> bool:
    """Whether a finish is of a failed attempt whose failure class the trace does not say.

    Its process ran (an exit code) and failed, and neither the finish nor a
    ``retry`` or ``needs_login`` before it names why: the supervisor that
    wrote it either found no class (billing, a refused request) or did not
    yet trace classes. A replay cannot tell which.
    """
    return (
        fields["outcome"] == "failed"
        and fields.get("failure") is None
        and fields.get("exit_code") is not None
        and said.retried is None
        and said.login is None
    )


def _recorded(
    where: str,
    t: float,
    fields: Mapping[str, Any],
    said: Signals,
    began: tuple[float, float, float],
) -> RecordedAttempt:
    """The attempt a ``finish`` at ``t`` ended, begun as ``began`` says (:func:`_answered`)."""
    origin, after, by = began
    if said.more or fields["outcome"] == "failed" or not _PLAIN.issuperset(fields):
        ended = recorded_end(where, fields, said)
        return RecordedAttempt(
            round(t - origin, 6),
            ended.outcome,
            fields.get("exit_code"),
            said.resets_at,
            ended.usage,
            ended.limit,
            ended.reported,
            ends_at=t,
            answers_after=after,
            answers_by=by,
        )
    return RecordedAttempt(
        round(t - origin, 6),
        fields["outcome"],
        fields.get("exit_code"),
        said.resets_at,
        ends_at=t,
        answers_after=after,
        answers_by=by,
    )


def _carried(
    header: TraceHeader,
    arrivals: list[Arrival],
    plans: dict[str, RunPlan],
    started: dict[str, tuple[float, float, float]],
) -> None:
    """What a rotated file's header restates, put first in ``arrivals``, ``plans`` and ``started``.

    What was running and queued when the file began: they arrive first, the
    running ones before the rest (they held their slots already), each taken
    to start at the file's beginning.
    """
    carry = header.carry or {}
    for rest in carry.get("rests", []):
        arrivals.append(Arrival(0.0, "rest", dict(rest)))
    for held in carry.get("running", []):
        run = held["run"]
        plans.setdefault(run["id"], RunPlan(len(plans)))
        # Back on the account it was running on, if that one can take it.
        arrivals.append(Arrival(0.0, "submit", {"run": run, "account": held.get("account")}))
        started[run["id"]] = (0.0, -START_LATENCY, 0.0)
    for run in carry.get("queued", []):
        plans.setdefault(run["id"], RunPlan(len(plans)))
        arrivals.append(Arrival(0.0, "submit", {"run": run}))


#: Events traced as their commit ends, whose runs are queued only then (a
#: fleet member's submit, not even then: at a poll): a finish read while
#: one was being committed decided without them, though traced after them.
_QUEUED_AT_COMMIT: Final = frozenset({"submit", "skip", "fleet_submit", "poll"})

#: A finish's fields that say nothing of how its attempt failed or what it spent.
_PLAIN: Final = frozenset({"run_id", "outcome", "exit_code", "requeued"})

#: No event before a finish said anything of its attempt.
_NO_SIGNALS: Final = Signals()


def _waits_with_their_runs(workload: Workload) -> Workload:
    """``workload`` with each ``removal_wait`` a replay holds given its run; the others unheld.

    A submit that waited for a sweep's removal is traced twice: as it began
    to wait (``removal_wait``, its run's id) and once recorded (``submit``,
    its run). A replay holds the run from the first to the second, so it
    needs the run at the first. One whose submit never came (the
    supervisor stopped meanwhile) never reached the ledger: nothing of it
    is replayed. One during whose wait another submit to its conversation
    came is not held (``unheld``, with its time): the replay holds a
    conversation's removal for one run at a time, and that other submit
    would wait on the same hold, for ever in the trio replay's driver.
    """
    arrivals = workload.arrivals
    if not any(arrival.kind == "removal_wait" for arrival in arrivals):
        return workload
    submits: dict[str, int] = {}
    for n, arrival in enumerate(arrivals):
        if arrival.kind == "submit":
            submits.setdefault(arrival.fields["run"]["id"], n)
    paired: list[Arrival] = []
    unheld: list[tuple[str, float]] = []
    for n, arrival in enumerate(arrivals):
        if arrival.kind == "removal_wait":
            run_id = arrival.fields["run_id"]
            at = submits.get(run_id)
            if at is None or at < n:
                continue
            run = arrivals[at].fields["run"]
            if any(_same_conversation(other, run) for other in arrivals[n + 1 : at]):
                unheld.append((run_id, arrival.t))
                continue
            paired.append(Arrival(arrival.t, arrival.kind, {"run_id": run_id, "run": run}))
        else:
            paired.append(arrival)
    return attrs.evolve(workload, arrivals=tuple(paired), unheld=tuple(unheld))


def _same_conversation(arrival: Arrival, run: Mapping[str, Any]) -> bool:
    """Whether ``arrival`` submits a run of ``run``'s conversation (a skip never waits)."""
    if arrival.kind != "submit":
        return False  # another wait's own submit, later, is what would wait on the hold
    other: Mapping[str, Any] = arrival.fields["run"]
    return bool(other.get("conversation") == run.get("conversation")) and bool(
        other.get("workspace", "default") == run.get("workspace", "default")
    )


def _still_running(
    started: Mapping[str, tuple[float, float, float]],
    plans: Mapping[str, RunPlan],
    rotated_at: float | None,
    arrivals: Sequence[Arrival],
    last_t: float,
) -> float | None:
    """Give the runs still running where the recording ends an attempt; when it was cut short.

    Rotated: they ran at least until then (what happens after is not this
    file's). Ended with no shutdown (the supervisor was killed, or the file
    was read while it ran): the recording never says when they end, so they
    never do, since a replay that ended them would decide what the recorded
    supervisor never did; the time of its last event is returned.
    """
    if not started or (rotated_at is None and any(a.kind == "shutdown" for a in arrivals)):
        return None
    end = math.inf if rotated_at is None else rotated_at
    for run_id, (origin, after, by) in started.items():
        if run_id in plans:
            plans[run_id].attempts.append(
                RecordedAttempt(
                    round(end - origin, 6),
                    "succeeded",
                    0,
                    ends_at=end,
                    answers_after=after,
                    answers_by=by,
                )
            )
    return last_t if rotated_at is None else None


#: How far a replay's end of a backoff may lie from the recorded finish plus
#: its delay: both are traced to the microsecond.
BACKOFF_SLACK = 1e-5


def _answered(
    cause: float,
    floor: float,
    t: float,
    backoff: float | None = None,
    *,
    earliest: float = math.inf,
    decided: float | None = None,
) -> tuple[float, float, float]:
    """A start at ``t``: the origin of its duration, and the window of moments it answers.

    ``backoff``: when the run's backoff ended, for a retry's start (its
    recorded finish plus the retry's delay). A replay starts it at that
    moment (if a slot is free) — which may come after the recorded start:
    the supervisor reads the time a little before it traces the finish, and
    the backoff runs from that reading. The window takes that moment in,
    and the attempt's duration runs from its own start (no traced event
    caused it).

    ``cause`` is the time of the last event before it other than a start,
    ``floor`` that of the last start before that event. A recorded start
    comes a few milliseconds after what allowed it (the commit of the
    start); timing each attempt from its cause, not from its start event,
    keeps those milliseconds from adding up in a what-if.

    Which event a start answered, the trace cannot say: the runs of one
    batch are all submitted before the first starts, and a start taken a
    moment late comes after whatever was traced meanwhile. An engine starts
    a run at once, at the event that let it start. That event came after the
    last start decided before this one's (a decision takes every run that
    may start then, and the trace keeps the ledger's order: the starts of
    one decision are traced together, after ``floor``), and at most
    ``START_LATENCY`` before it (see :class:`RecordedAttempt`) — or just
    after ``earliest``, however long before: the last event other than a
    submit, which lets only its own run start (no run starts before its
    submit). Under load the recorded supervisor can take longer than that
    to start a run it took on its submit, and trace other runs' submits
    meanwhile; an engine starts it at its submit, and must still end it
    where the recording did.

    ``decided``: when the recorded dispatcher decided it, if its line says
    (before ``t``): the window and the origin are taken from that moment;
    it still reaches ``t``.
    """
    by = t
    if decided is not None:
        t = decided
    if backoff is not None:
        after = min(max(floor, t - START_LATENCY), backoff - BACKOFF_SLACK)
        return t, after, max(by, backoff + BACKOFF_SLACK)
    # Longer after the last event than a start takes, it answered something
    # untraced (an account's rest ending): time it from itself.
    origin = cause if t - cause <= START_LATENCY else t
    return origin, max(floor, min(t - START_LATENCY, round(earliest - TICK, 6))), by


#: The exit code a synthetic attempt ends with: its process ran (so its
#: start counts against a budget), and stopped as such a run's would.
SYNTHETIC_EXIT_CODES: Mapping[str, int] = {
    "succeeded": 0,
    "failed": 1,
    "usage_limited": 1,
    "timed_out": -15,  # SIGTERM, as the runner stops a group
    "cancelled": -15,
}


def _described(fields: Mapping[str, Any]) -> bool:
    """Whether a submit line without a duration or outcome says how its run goes otherwise."""
    return "spend" in fields or "failure" in fields or "worked" in fields


def _add_synthetic(plan: RunPlan, where: str, fields: Mapping[str, Any]) -> None:
    """Give ``plan`` the attempt its submit line describes, and what any later attempt spends."""
    attempt = _synthetic(where, fields)
    spent = attempt.usage
    if spent is not None and "spend" in fields:
        # An attempt after this one (a retry, a run moved off a limited or
        # refused account) does the run's work in the same duration, so it
        # spends the line's spend, as a recorded retry's finish says its own:
        # a failed attempt that did its work burned its tokens all the same.
        plan.usage = RunUsage(tokens=spent.tokens, cost_usd=spent.cost_usd)
        if attempt.outcome == "usage_limited":
            # Refused at the limit, it did no work: the attempt after it spends.
            attempt = attrs.evolve(attempt, usage=None)
        elif spent.failure is ApiFailure.AUTHENTICATION:
            # Its login refused, it did no work either; its stream still
            # names the failure, which is how the supervisor knows it.
            attempt = attrs.evolve(attempt, usage=RunUsage(failure=spent.failure))
    plan.attempts.append(attempt)
    plan.synthetic = True


def _synthetic(where: str, fields: Mapping[str, Any]) -> Attempt:
    duration = fields.get("duration", 60.0)
    outcome = fields.get("outcome", "succeeded")
    if not isinstance(duration, int | float) or isinstance(duration, bool) or duration < 0:
        raise TraceFormatError(f"{where}: duration: expected seconds >= 0, got {duration!r}")
    if outcome not in OUTCOMES:
        raise TraceFormatError(
            f"{where}: outcome: expected one of {', '.join(OUTCOMES)}, got {outcome!r}"
        )
    if not _described(fields):  # the common line: nothing said of spend or failures
        return Attempt(float(duration), outcome, SYNTHETIC_EXIT_CODES[outcome])
    ending = read_failure(where, fields, outcome)
    usage = usage_of(where, fields, ending)
    worked = fields.get("worked", False)
    if not isinstance(worked, bool):
        raise TraceFormatError(f"{where}: worked: expected true or false, got {worked!r}")
    # Work done is said as a recorded attempt's agent says it.
    reported = Reported(worked=True) if worked else None
    if ending is not None:
        return Attempt(
            float(duration),
            outcome,
            ending.exit_code,
            usage=usage,
            limit=ending.limit,
            reported=reported,
        )
    return Attempt(
        float(duration), outcome, SYNTHETIC_EXIT_CODES[outcome], usage=usage, reported=reported
    )


def config_from_trace(
    config: Mapping[str, Any], name: str, overrides: Sequence[str] = ()
) -> LoadedConfig:
    """The configuration a trace header or reload event carries, validated again.

    ``name`` says where it came from in error messages (a bad one raises
    :class:`TraceFormatError` naming it and the key). ``null`` is "not set",
    except for the limits where it means "none", written ``"0"``.

    Loaded once per process for each distinct configuration (a plan's
    engine loads its configuration again for every simulation, a few
    milliseconds of TOML each time), and known by its JSON, in order (the
    providers' order is the configuration's), with the working folder and
    ``HOME`` the loading reads (relative paths are taken from the one,
    ``~`` from the other).
    """
    try:
        carried = json.dumps(config, allow_nan=False)
    except (TypeError, ValueError):  # not a trace's JSON: nothing to know it by
        return _load(config, name, overrides)
    loaded = _loaded(carried, name, tuple(overrides), os.getcwd(), os.environ.get("HOME"))
    # Its own list of warnings, which a caller may add to; the rest is read-only.
    return attrs.evolve(loaded, warnings=list(loaded.warnings))


# More than a plan's sweep usually has, so that a plan going through its
# configurations in turn, replication after replication, finds each still there.
@functools.lru_cache(maxsize=256)
def _loaded(
    carried: str, name: str, overrides: tuple[str, ...], cwd: str, home: str | None
) -> LoadedConfig:
    """The configuration in the JSON ``carried``, loaded (``cwd`` and ``home``
    are in the cache's key only: the load reads them)."""
    return _load(json.loads(carried), name, overrides)


def _load(config: Mapping[str, Any], name: str, overrides: Sequence[str]) -> LoadedConfig:
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
    if isinstance(value, (list, tuple)):  # alike in JSON, and so to config_from_trace
        return [_as_toml(item) for item in value]
    return value
