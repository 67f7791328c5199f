"""A replay decides a start when the recorded supervisor decided it, though that was late.

Under load the recorded supervisor's dispatcher can decide a start tens of
milliseconds after what let it start: its timer for the end of a retry's
backoff fires late, and by then another backoff has ended too. The replay's
timer fires on time: it decides with fewer runs to choose from, and may
start another run first. A ``start`` says when it was decided
(``decided``), and a replay whose timer is due with nothing else before
that moment decides then.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import config_json

from herdsman.core.retry import RetryPolicy
from herdsman.sim.decisions import read_decisions, timeline_of
from herdsman.sim.diff import first_divergence, report
from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload
from herdsman.trace import read_trace_text

# Two slots, a retry after 0.5 s to 1 s (jittered by the run's id).
CONFIG = """\
[supervisor]
state_dir = "/s"
[providers.p]
exec = ["x"]
protocol = "claude"
concurrency = 2
[providers.p.retry]
attempts = 3
on = ["overloaded"]
backoff = "1s"
backoff_max = "2s"
"""
POLICY = RetryPolicy(attempts=3, backoff=1.0, backoff_max=2.0)

STARTED = "2026-12-02T06:00:00.000000Z"
ORIGIN = dt.datetime.fromisoformat(STARTED).timestamp()


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def submit(t: float, run_id: str) -> dict[str, Any]:
    return {"t": t, "event": "submit", "run": {"id": run_id, "provider": "p"}}


def start(t: float, run_id: str, decided: float | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"t": t, "event": "start", "run_id": run_id, "account": None}
    if decided is not None:
        event["decided"] = decided
    return event


def finish(t: float, run_id: str) -> dict[str, Any]:
    return {"t": t, "event": "finish", "run_id": run_id, "outcome": "succeeded", "exit_code": 0}


def failed(t: float, run_id: str, read: float) -> list[dict[str, Any]]:
    """A first attempt that failed overloaded, its end read at ``read``, and its retry."""
    delay = round(POLICY.delay(run_id, 1), 6)  # as a trace writes it
    retry = {
        "t": t,
        "event": "retry",
        "run_id": run_id,
        "attempt": 1,
        "failure": "overloaded",
        "at": round(ORIGIN + read + delay, 6),
        "delay": delay,
    }
    end = {
        "t": t,
        "event": "finish",
        "run_id": run_id,
        "outcome": "failed",
        "exit_code": 1,
        "failure": "overloaded",
        "requeued": True,
    }
    return [retry, end]


def recording(path: Path, events: list[dict[str, Any]]) -> Path:
    header = {"herdsman_trace": 1, "started_at": STARTED, "config": config_json(CONFIG)}
    lines = [header] + [{"t": e["t"], "seq": n, **e} for n, e in enumerate(events)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def replayed(trace: Path, engine: str) -> str:
    """The trace ``engine`` writes replaying ``trace`` under its own configuration."""
    workload = read_workload(trace)
    loaded = config_from_trace(workload.header.config, str(trace))
    return (fast_replay if engine == "fast" else replay)(workload, loaded).trace


def divergence(trace: Path, text: str) -> str | None:
    """Where ``text`` (a replay of ``trace``) first decides otherwise, as ``sim diff`` says it."""
    recorded = read_decisions(trace)
    again = timeline_of(read_trace_text(text, "replayed")[1])
    found = first_divergence(recorded, again)
    return None if found is None else report(found, recorded, again, ("recorded", "replayed"))


def finishes(text: str) -> list[tuple[float, str]]:
    """Each finish's time and run in a trace held in memory, in order."""
    events = [json.loads(line) for line in text.splitlines()[1:]]
    return [(e["t"], e["run_id"]) for e in events if e["event"] == "finish"]


# "first" was submitted before "second", so it heads the queue once both
# may start. second's backoff ends at 1.48525, first's 5 ms later; the
# dispatcher's timer, due at second's, fired 30 ms late, at 1.51525: both
# backoffs were over, one slot was free (other holds the other), and first
# went. On time, the replay's timer starts second alone.
SECOND_ENDS = round(0.5 + POLICY.delay("second", 1), 6)
LATE_TIMER = [
    submit(0.1, "first"),
    start(0.1001, "first"),
    submit(0.2, "second"),
    start(0.2001, "second"),
    *failed(0.5002, "second", read=0.5),
    *failed(0.6212, "first", read=round(SECOND_ENDS + 0.005 - POLICY.delay("first", 1), 6)),
    submit(0.7, "other"),
    start(0.7001, "other"),
    start(round(SECOND_ENDS + 0.0303, 6), "first", decided=round(SECOND_ENDS + 0.03, 6)),
    finish(2.0, "other"),
    start(2.0001, "second"),
    finish(2.5, "first"),
    finish(3.0, "second"),
    {"t": 3.1, "event": "shutdown"},
]


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_start_decided_by_a_late_timer_is_decided_when_it_was(
    tmp_path: Path, engine: str
) -> None:
    trace = recording(tmp_path / "late-timer.jsonl", LATE_TIMER)
    text = replayed(trace, engine)
    assert divergence(trace, text) is None, divergence(trace, text)
    # Decided at 1.51525, first ends where it ended (its start answered that moment).
    assert (2.5, "first") in finishes(text)
    # The replay decides at the moment it traces: its own trace never says
    # decided (a simulated trace stays byte for byte as before the field).
    assert '"decided"' not in text


# The same backoffs, the timer as late, and other's end read in between,
# 10 ms after second's backoff ended (its finish traced 1 ms later): that
# end decided the starts, both runs' backoffs over, first ahead.
FINISH_BETWEEN = [
    *LATE_TIMER[:10],
    {**finish(round(SECOND_ENDS + 0.011, 6), "other"), "ended": round(SECOND_ENDS + 0.01, 6)},
    start(round(SECOND_ENDS + 0.0111, 6), "first", decided=round(SECOND_ENDS + 0.01, 6)),
    start(round(SECOND_ENDS + 0.0112, 6), "second", decided=round(SECOND_ENDS + 0.01, 6)),
    finish(2.5, "first"),
    finish(3.0, "second"),
    {"t": 3.1, "event": "shutdown"},
]


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_starts_decided_by_a_finish_read_before_a_late_timer_are_decided_as_recorded(
    tmp_path: Path, engine: str
) -> None:
    trace = recording(tmp_path / "finish-between.jsonl", FINISH_BETWEEN)
    text = replayed(trace, engine)
    assert divergence(trace, text) is None, divergence(trace, text)


# Two slots: a runs, y waits behind it on its conversation, x is submitted
# at 1.0 with a slot free. The submitting task resumed only at 1.03; a's
# end, read at 1.01 meanwhile, decided the starts its slot and the free one
# allowed, in queue order: y, then x. A replay that starts x at its submit
# starts it before a's end, and y after.
LATE_SUBMIT = [
    {"t": 0.0, "event": "submit", "run": {"id": "a", "provider": "p", "conversation": "c"}},
    start(0.0001, "a"),
    {"t": 0.1, "event": "submit", "run": {"id": "y", "provider": "p", "conversation": "c"}},
    {"t": 1.0, "event": "submit", "run": {"id": "x", "provider": "p", "conversation": "x"}},
    {**finish(1.011, "a"), "ended": 1.01},
    start(1.0111, "y", decided=1.01),
    start(1.0112, "x", decided=1.01),
    finish(2.0, "x"),
    finish(2.5, "y"),
    {"t": 3.0, "event": "shutdown"},
]


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_start_decided_late_after_its_submit_is_decided_when_it_was(
    tmp_path: Path, engine: str
) -> None:
    trace = recording(tmp_path / "late-submit.jsonl", LATE_SUBMIT)
    text = replayed(trace, engine)
    assert divergence(trace, text) is None, divergence(trace, text)
    # Each ends as recorded: x's start answered a's end, as recorded.
    assert finishes(text) == [(1.01, "a"), (2.0, "x"), (2.5, "y")]


@pytest.mark.parametrize(
    "events", [LATE_TIMER, FINISH_BETWEEN, LATE_SUBMIT], ids=["timer", "between", "submit"]
)
@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_start_without_decided_is_decided_on_time_as_before(
    tmp_path: Path, engine: str, events: list[dict[str, Any]]
) -> None:
    # A trace written before starts said when they were decided: the timer
    # fires on time, the submitted run goes in at its submit; each diverges
    # as the field's tests above say it would without it.
    old = [{k: v for k, v in e.items() if k != "decided"} for e in events]
    trace = recording(tmp_path / "old.jsonl", old)
    assert divergence(trace, replayed(trace, engine)) is not None
