"""A fleet's members' recorded traces: each read as a member, and all merged into one workload.

:mod:`herdsman.sim.fleet_replay` replays the merged workload on the fleet
model; what it delivers to each member (the inputs in time order, who
held what, the notes found afterwards) is worked out here from the traces.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from herdsman.runtime.runner.run_usage import RunUsage
from herdsman.sim.workload import (
    DEFAULT_DURATION,
    RecordedAttempt,
    RunPlan,
    Workload,
    config_from_trace,
    held_to,
)
from herdsman.trace import TraceEvent, TraceFormatError, read_trace, read_trace_text

__all__ = ["Member", "read_member"]


@attrs.frozen
class Member:
    """One member's recorded trace: its name (the file), workload and events."""

    name: str
    workload: Workload
    events: tuple[TraceEvent, ...]
    #: The poll the member made as it started, if it took anything (else untraced).
    startup: TraceEvent | None = None

    @property
    def started_at(self) -> float:
        """The header's time, unix seconds."""
        return self.workload.started_at


def read_member(path: Path) -> Member:
    """Read ``path`` as a fleet member's trace; :class:`TraceFormatError` if it cannot be one."""
    from herdsman.sim.workload import read_workload  # noqa: PLC0415 - one module less to load

    workload = read_workload(path)
    header = workload.header
    if header.fuzz is not None or header.generator is not None:
        raise TraceFormatError(
            f"{path}: a fuzz case or a generated workload is not a fleet member's trace;"
            " give several traces only of one fleet's members"
        )
    if not (header.config.get("fleet") or {}).get("enabled"):
        raise TraceFormatError(
            f"{path}:1: config.fleet.enabled: this trace is not a fleet member's; several"
            " traces replay together only as the members of one fleet"
        )
    if header.carry is not None:
        raise TraceFormatError(
            f"{path}:1: carry: a rotated member file begins in the middle of a member's"
            " life; replay the member's files from its first (or this one alone)"
        )
    _, read = read_trace(path)
    events = tuple(read)
    # A member polls as it starts, before anything else is traced; its timer
    # polls a whole interval later, and a submit here (which pokes a poll) is
    # traced first. So a poll that comes first, sooner than an interval, is
    # the start-up poll.
    interval = config_from_trace(header.config, f"{path}:1").config.fleet.poll.total_seconds()
    first = events[0] if events else None
    startup = first if first is not None and first.event == "poll" and first.t < interval else None
    return Member(str(path), workload, events, startup)


@attrs.frozen(order=True)
class _Input:
    """Something delivered to one member: ``(t, member, line)`` orders them all."""

    t: float  # on the replay's clock: seconds since the earliest member's header
    member: int
    line: float
    kind: str = attrs.field(order=False)
    fields: Mapping[str, Any] = attrs.field(order=False)


#: Delivered as they are to a lone supervisor's replay.
_PASSED_ON = frozenset({"shutdown", "reload", "rest_ended"})


def _inputs(
    members: Sequence[Member], offsets: Sequence[float]
) -> tuple[list[_Input], list[tuple[float, str]], list[tuple[float, str]]]:
    """Every member's inputs in one order, and notes (with their time) on what the traces
    lack: a member missing, members killed."""
    inputs: list[_Input] = []
    submitted: set[str] = set()  # runs a given trace took the submit of
    for member in members:
        for event in member.events:
            if event.event in ("fleet_submit", "skip"):
                submitted.add(event.fields["run"]["id"])
    injected: list[tuple[float, str, str, int]] = []  # (t, run, trace, line)
    killed: list[tuple[float, str]] = []
    seen: set[str] = set()
    traced_polls = any(e.event == "poll" for m in members for e in m.events)
    held: dict[int, float] = {}  # a poll's input, by index, and when to deliver it instead
    for index, (member, offset) in enumerate(zip(members, offsets, strict=True)):
        inputs.append(_Input(offset, index, 0, "join", {}))
        if member.events and not any(e.event == "shutdown" for e in member.events):
            # Its trace just ends: killed (or read while it ran) after its last line.
            last = member.events[-1]
            inputs.append(_Input(offset + last.t, index, last.line + 0.5, "kill", {}))
            if member.workload.cut_at is not None:
                killed.append(
                    (
                        offset + last.t,
                        f"{member.name}:{last.line}: the trace ends here with runs running and"
                        " no shutdown (the member was killed, or the file read while it ran):"
                        " the replay kills it here, so its lease lapses and its runs are"
                        " declared lost from then on; when the recorded fleet did that is in"
                        " no trace, so the others' decisions after it may differ",
                    )
                )
        poll_t, poll_line = offset, 0.0  # the start-up poll, as the member joins
        decisions = _decisions(member)
        for event in member.events:
            kind, fields, t = event.event, event.fields, offset + event.t
            if kind == "poll":
                poll_t, poll_line = t, event.line
                if event is not member.startup:  # that one is made as the member joins
                    decided = _decided_after(event, decisions)
                    if decided is not None:
                        held[len(inputs)] = offset + decided
                    inputs.append(_Input(t, index, event.line, "poll", fields))
            elif kind == "fleet_submit":
                inputs.append(_Input(t, index, event.line, "submit", fields))
            elif kind == "skip":
                inputs.append(_Input(t, index, event.line, "skip", fields))
            elif kind in ("cancel", "fleet_cancel"):
                inputs.append(_Input(t, index, event.line, "cancel", fields))
            elif kind in _PASSED_ON:
                inputs.append(_Input(t, index, event.line, kind, fields))
            elif kind == "submit" and fields["run"]["id"] not in submitted:
                injected.append((t, fields["run"]["id"], member.name, event.line))
                # Just before the poll that took it: the ledger had it by then.
                run = fields["run"]
                inputs.append(_Input(poll_t, index, poll_line - 0.5, "inject", {"run": run}))
    inputs = _held_to_decision(inputs, held)
    injected.sort()
    first = []
    for item in injected:  # each run once, where it was first polled
        if item[1] not in seen:
            seen.add(item[1])
            first.append(item)
    notes: list[tuple[float, str]] = []
    if first and not traced_polls:
        notes.append(
            (
                first[0][0],
                "these traces hold no fleet_submit or poll events (recorded before herdsman"
                " traced a fleet's submits and polls): each run goes into the ledger where a"
                " trace first shows it polled, and each member polls on its own timer, so"
                " which member takes a run may differ from the recording",
            )
        )
    elif first:
        _, run_id, name, line = first[0]
        notes.append(
            (
                first[0][0],
                f"{name}:{line}: run {run_id} was submitted to a member whose trace is not"
                f" given (no trace given took its submit; {len(first)} run(s) so): it goes"
                " into the ledger at this poll, and what that member decided (its claims,"
                " the lanes it held) is not replayed, so decisions from here on may differ",
            )
        )
    return inputs, notes, killed


def _decisions(member: Member) -> dict[str, list[tuple[int, float, float | None]]]:
    """Each run's starts in ``member``'s trace, in order: line, time and ``decided``."""
    decisions: dict[str, list[tuple[int, float, float | None]]] = {}
    for event in member.events:
        if event.event == "start":
            decided = event.fields.get("decided")
            decisions.setdefault(event.fields["run_id"], []).append((event.line, event.t, decided))
    return decisions


def _decided_after(
    poll: TraceEvent, decisions: Mapping[str, Sequence[tuple[int, float, float | None]]]
) -> float | None:
    """When the member first decided a start of a run ``poll`` took, if that start's line
    says so (``decided``); else None (whether the poll is held then: :func:`held_to`).

    A start without ``decided`` was decided at its line (or its trace was
    written before the field existed): it stands for itself. A poll that
    did more than take runs (runs left, cancels, parked runs put back) is
    never held: those took effect at its line.
    """
    fields = poll.fields
    if fields["left"] or fields["cancels"] or fields.get("parked") or not fields["runs"]:
        return None
    first: tuple[float, bool] | None = None  # (moment, said by its decided)
    for run_id in fields["runs"]:
        after = next(
            (
                (t if decided is None else decided, decided is not None)
                for line, t, decided in decisions.get(run_id, ())
                if line > poll.line
            ),
            None,
        )
        if after is not None and (first is None or after[0] < first[0]):
            first = after
    return None if first is None or not first[1] else first[0]


def _held_to_decision(inputs: list[_Input], held: Mapping[int, float]) -> list[_Input]:
    """``inputs`` in order, each poll in ``held`` delivered at its moment there instead.

    A member traces a poll as it queues the runs the poll took, and wakes
    its dispatcher; under load that resumes tens of milliseconds later, and
    a run's end read meanwhile decides first, with the starts its freed slot
    allows, the polled runs among them, in queue order. Delivered at its
    line, the poll would start its runs before that end. So a poll whose
    runs' first start here was decided later (``decided``, within
    ``START_LATENCY``) is delivered then, if no other input, of any member,
    comes between (so that inputs keep their order); ends due at that moment
    go first, as recorded. The lone supervisor's replay holds a submit by
    the same rule (:func:`~herdsman.sim.workload.held_to`).
    """
    order = sorted(range(len(inputs)), key=inputs.__getitem__)
    moved = [inputs[n] for n in order]
    for at, n in enumerate(order):
        decided = held.get(n)
        if decided is not None:
            following = moved[at + 1].t if at + 1 < len(moved) else math.inf
            moment = held_to(moved[at].t, decided, following)
            if moment != moved[at].t:
                moved[at] = attrs.evolve(moved[at], t=moment)
    return moved


def _holders(members: Sequence[Member], texts: Sequence[str]) -> dict[str, set[str]]:
    """Which members started each run, in the given traces (``texts``: their text, or the
    recorded events when empty)."""
    holders: dict[str, set[str]] = {}
    for member, text in zip(members, texts, strict=True):
        events = read_trace_text(text, member.name)[1] if text else iter(member.events)
        for event in events:
            if event.event == "start":
                holders.setdefault(event.fields["run_id"], set()).add(member.name)
    return holders


def _later_notes(
    members: Sequence[Member],
    offsets: Sequence[float],
    replayed: Sequence[str],
    defaulted: Sequence[str],
    cause: str,
    *,
    polls: bool = True,
) -> list[tuple[float, str]]:
    """What the replay found it could not reproduce: the first poll that learned otherwise
    than recorded about a run some member started otherwise, and the first run started
    here that no member given started in the recording. ``cause``: why, as far as known."""
    notes: list[tuple[float, str]] = []
    before = _holders(members, [""] * len(members))
    after = _holders(members, replayed)
    unstarted = set(defaulted)
    starts: list[tuple[float, str, str, int]] = []
    for member, offset, text in zip(members, offsets, replayed, strict=True):
        if not text:
            continue
        events = list(read_trace_text(text, f"{member.name} (replayed)")[1])
        starts += [
            (offset + e.t, e.fields["run_id"], member.name, e.line)
            for e in events
            if e.event == "start" and e.fields["run_id"] in unstarted
        ]
        # A what-if's polls come at other moments: not to be paired.
        replayed_polls = [e for e in events if e.event == "poll"] if polls else []
        recorded = [e for e in member.events if e.event == "poll"]
        for was, now in zip(recorded, replayed_polls, strict=False):
            differ = {
                run_id
                for key in ("runs", "left", "cancels")
                for run_id in set(was.fields[key]) ^ set(now.fields[key])
            }
            # A run this member learned of otherwise, but which every member
            # started as recorded, changed nothing (a claim's commit a few
            # milliseconds after the poll that took it: the race's loser
            # polled it still queued, and was refused it).
            if any(before.get(run_id, set()) != after.get(run_id, set()) for run_id in differ):
                notes.append(
                    (
                        offset + was.t,
                        f"{member.name}:{was.line}: this poll {_told(was)} in the recording,"
                        f" and {_told(now)} in the replay: {cause}",
                    )
                )
                break
    if starts:
        t, run_id, name, line = min(starts)
        notes.append(
            (
                t,
                f"{name}: run {run_id} starts in the replay (line {line} of its output), but"
                f" no trace given records its start ({len(unstarted)} run(s) so, each given"
                f" {DEFAULT_DURATION:g} s): {cause}",
            )
        )
    return notes


#: How a poll's fields read in a note.
_TOLD = (("took", "runs"), ("saw leave", "left"), ("brought cancels of", "cancels"))


def _told(event: TraceEvent) -> str:
    fields = event.fields
    parts = [f"{what} {', '.join(fields[key])}" for what, key in _TOLD if fields[key]]
    if fields.get("parked"):
        parts.append(f"put back {fields['parked']} parked run(s)")
    return " and ".join(parts) or "changed nothing"


def _merged(members: Sequence[Member], offsets: Sequence[float]) -> Workload:
    """One workload for the fleet's runs: each run's attempts from whichever trace ran them.

    Times move onto the replay's clock; a run tried on two members (a usage
    limit, then another member) has its attempts in the order they ended.
    So do the members' ``wakes`` (when their dispatchers decided a start
    late), in one order: the driver sees only the fleet's next timer, not
    whose it is, so a timer due shortly before any member's late decision,
    with no input and no run's end between, fires then (``late_wake``).
    """
    firsts: dict[str, float] = {}
    attempts: dict[str, list[Any]] = {}
    synthetic: set[str] = set()
    usage: dict[str, RunUsage] = {}  # what a synthetic run's later attempts spend
    for member, offset in zip(members, offsets, strict=True):
        for event in member.events:
            run = event.fields.get("run") if event.event in ("fleet_submit", "submit") else None
            if run is not None:
                t = offset + event.t
                firsts[run["id"]] = min(firsts.get(run["id"], t), t)
        for run_id, plan in member.workload.plans.items():
            bucket = attempts.setdefault(run_id, [])
            if plan.synthetic:
                synthetic.add(run_id)
            if plan.usage is not None:
                usage[run_id] = plan.usage
            for attempt in plan.attempts:
                bucket.append(
                    attrs.evolve(
                        attempt,
                        ends_at=attempt.ends_at + offset,
                        answers_after=attempt.answers_after + offset,
                        answers_by=attempt.answers_by + offset,
                    )
                    if isinstance(attempt, RecordedAttempt)
                    else attempt
                )
    for bucket in attempts.values():
        bucket.sort(key=lambda a: a.ends_at if isinstance(a, RecordedAttempt) else math.inf)
    order = sorted(attempts, key=lambda run_id: (firsts.get(run_id, math.inf), run_id))
    plans = {
        run_id: RunPlan(index, attempts[run_id], run_id in synthetic, usage.get(run_id))
        for index, run_id in enumerate(order)
    }
    wakes = sorted(
        offset + wake
        for member, offset in zip(members, offsets, strict=True)
        for wake in member.workload.wakes
    )
    first = members[0].workload
    return Workload(first.header, first.started_at, (), plans, wakes=tuple(wakes))


# -- the members -----------------------------------------------------------------------
