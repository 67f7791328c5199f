"""``herdsman sim diff A B``: the first decision two traces disagree on, and what led to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from herdsman.sim.decisions import Decision, Timeline, pairs
from herdsman.sim.workload import START_LATENCY
from herdsman.trace import read_trace

__all__ = ["Divergence", "diff_json", "first_divergence", "report", "workload_note"]

#: How many decisions before the divergence the report shows.
CONTEXT = 5


@attrs.frozen
class Divergence:
    """Where two traces' decisions first differ."""

    index: int
    expected: Decision | None
    actual: Decision | None
    before: tuple[Decision, ...]


def first_divergence(a: Timeline, b: Timeline) -> Divergence | None:
    """The first index where the decisions differ (times aside), or None.

    A trace whose file was rotated away ends early, not for good: the other
    trace's decisions from its rotation on (a replay of that file goes on)
    are not compared. A start decided just before the rotation may have
    been written just after it, in the next file, so the last
    ``START_LATENCY`` seconds before it are given the same benefit.
    """
    for index, left, right in pairs(a, b):
        if _past_the_end(left, right, a) or _past_the_end(right, left, b):
            return None
        if left is None or right is None or _key(left) != _key(right):
            return Divergence(index, left, right, a.decisions[max(0, index - CONTEXT) : index])
    return None


def _past_the_end(mine: Decision | None, theirs: Decision | None, rotated: Timeline) -> bool:
    """Both traces are past where ``rotated`` (ended by a rotation) can speak for.

    ``mine`` is the rotated trace's next decision (None once it has no more),
    ``theirs`` the other trace's.
    """
    if theirs is None or rotated.rotated_at is None:
        return False
    edge = rotated.rotated_at - START_LATENCY
    return theirs.t >= edge and (mine is None or mine.t >= edge)


def _key(decision: Decision) -> tuple[object, ...]:
    return (decision.kind, decision.run_id, decision.what)


def report(divergence: Divergence, a: Timeline, b: Timeline, names: tuple[str, str]) -> str:
    """A few lines a person can act on."""
    first = divergence.expected or divergence.actual
    assert first is not None
    run_id = first.run_id
    conversation = a.conversations.get(run_id, b.conversations.get(run_id))
    lines = [
        f"the traces diverge at decision {divergence.index}"
        f" (run {run_id}, conversation {conversation or '-'}):",
        f"  {names[0]}: {_at(divergence.expected)}",
        f"  {names[1]}: {_at(divergence.actual)}",
    ]
    if divergence.before:
        lines.append(f"the {len(divergence.before)} decision(s) before it, as both traces agree:")
        lines += [f"  {_at(decision)}" for decision in divergence.before]
    return "\n".join(lines)


def workload_note(path: Path, timeline: Timeline) -> str | None:
    """What to compare instead, when ``path`` is a workload rather than a trace of decisions.

    A workload (``sim generate``'s, or a sample such as ``sim/team-day.jsonl``)
    says how long each run takes, on its submits, and decides nothing: diffed
    against its own replay it "diverges" at decision 0, and two workloads
    "agree" on none. Neither answer is the one meant.
    """
    if timeline.decisions:
        return None
    _, events = read_trace(path)
    if not any(event.event == "submit" and "duration" in event.fields for event in events):
        return None
    return (
        f"{path} is a workload, not a replay: its submits give each run's duration and"
        f" outcome, and it holds no decisions; replay it (herdsman sim replay {path}"
        " --out OUT) and compare OUT with another replay of it"
    )


def _at(decision: Decision | None) -> str:
    if decision is None:
        return "(no more decisions)"
    return f"t={decision.t:.3f}  {decision.describe()}  (line {decision.line})"


def diff_json(
    divergence: Divergence | None, a: Timeline, b: Timeline, names: tuple[str, str]
) -> dict[str, Any]:
    """``sim diff --json``: what :func:`report` says, as data (docs/simulator.md)."""
    rotated = [
        name
        for name, timeline, other in ((names[0], a, b), (names[1], b, a))
        if timeline.rotated and len(other.decisions) > len(timeline.decisions)
    ]
    answer: dict[str, Any] = {
        "agree": divergence is None,
        "expected": names[0],
        "actual": names[1],
        "compared": min(len(a.decisions), len(b.decisions)),
        "rotated": rotated,
        "divergence": None,
    }
    if divergence is not None:
        first = divergence.expected or divergence.actual
        assert first is not None
        answer["compared"] = divergence.index + 1
        answer["divergence"] = {
            "index": divergence.index,
            "run_id": first.run_id,
            "conversation": a.conversations.get(first.run_id, b.conversations.get(first.run_id)),
            "expected": _decision_json(divergence.expected),
            "actual": _decision_json(divergence.actual),
            "before": [_decision_json(decision) for decision in divergence.before],
        }
    return answer


def _decision_json(decision: Decision | None) -> dict[str, Any] | None:
    if decision is None:
        return None
    return {
        "kind": decision.kind,
        "run_id": decision.run_id,
        "what": dict(decision.what),
        "t": decision.t,
        "line": decision.line,
    }
