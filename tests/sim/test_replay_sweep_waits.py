"""A submit that waited for a sweep's removal is held as long by both replays.

While a retention sweep removes a conversation's worktrees, a submit to it
waits, its conversation claimed: a submit with ``on_busy = "skip"`` then is
skipped. The trace says so with ``removal_wait``; these hand-written
recordings check that both engines decide as recorded, and what they do
when they cannot hold a wait.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_workloads import config_json
from test_recorded_timing import finish, start

from herdsman.sim.decisions import timeline_of
from herdsman.sim.diff import first_divergence, report
from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.result import ReplayResult, recording_ends, summary
from herdsman.sim.workload import Workload, config_from_trace, read_workload_text
from herdsman.trace import TraceFormatError, read_trace_text

REPO = """\
[supervisor]
state_dir = "/s"
[providers.p]
exec = ["x"]
concurrency = 2
[retention]
idle = "0s"
sweep_interval = "1s"
"""
WITH_REPO = REPO + '[[repos]]\nname = "repo"\npath = "/r"\n'


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def trace_text(events: list[dict[str, Any]], config: str = WITH_REPO) -> str:
    """A recording: the header, then ``events`` numbered in order."""
    header = {
        "herdsman_trace": 1,
        "started_at": "2026-11-29T12:00:00.000000Z",
        "config": config_json(config),
    }
    lines = [json.dumps(header)]
    lines += [json.dumps({"t": e["t"], "seq": n, **e}) for n, e in enumerate(events)]
    return "\n".join(lines) + "\n"


def submit(t: float, run_id: str, conversation: str, kind: str = "submit") -> dict[str, Any]:
    run = {"id": run_id, "provider": "p", "conversation": conversation, "workspace": "default"}
    return {"t": t, "event": kind, "run": run}


def wait(t: float, run_id: str) -> dict[str, Any]:
    return {"t": t, "event": "removal_wait", "run_id": run_id}


#: a runs in c; a sweep removes c's worktree; b's submit to c waits for it
#: meanwhile, s (on_busy = skip, to c) is skipped and x (in d) starts.
WAITED = [
    submit(0.0, "a", "c"),
    start(0.01, "a"),
    finish(1.0, "a"),
    wait(1.2, "b"),
    submit(1.3, "s", "c", "skip"),
    submit(1.4, "x", "d"),
    start(1.41, "x"),
    submit(1.6, "b", "c"),
    start(1.61, "b"),
    finish(2.5, "x"),
    finish(2.6, "b"),
    {"t": 3.0, "event": "shutdown"},
]


def both(text: str, config: str | None = None) -> tuple[Workload, ReplayResult, ReplayResult]:
    """The workload of ``text``, and its replays by both engines (with its config or ``config``)."""
    workload = read_workload_text(text, "recorded")
    loaded = config_from_trace(
        workload.header.config if config is None else config_json(config), "recorded"
    )
    slow = replay(workload, loaded)
    fast = recording_ends(fast_replay(workload, loaded), workload)
    assert fast.trace == slow.trace, "the engines disagree"
    return workload, slow, fast


def assert_as_recorded(recorded: str, replayed: str) -> None:
    a = timeline_of(read_trace_text(recorded, "recorded")[1])
    b = timeline_of(read_trace_text(replayed, "replayed")[1])
    divergence = first_divergence(a, b)
    assert divergence is None, report(divergence, a, b, ("recorded", "replayed"))


def test_a_skip_during_a_recorded_wait_is_skipped_by_both_replays() -> None:
    text = trace_text(WAITED)
    _, slow, _ = both(text)
    assert_as_recorded(text, slow.trace)
    events = [json.loads(line) for line in slow.trace.splitlines()[1:]]
    # The replayed supervisor waited too, from the recorded moment.
    assert {"t": 1.2, "seq": 3, "event": "removal_wait", "run_id": "b"} in events


def test_a_wait_whose_submit_never_came_is_not_replayed() -> None:
    # The supervisor stopped before z's submit was recorded: z never was.
    text = trace_text([*WAITED[:-1], wait(2.8, "z"), WAITED[-1]])
    workload, slow, _ = both(text)
    assert all(a.fields.get("run_id") != "z" for a in workload.arrivals)
    assert_as_recorded(text, slow.trace)
    assert '"z"' not in slow.trace


def test_a_wait_crowded_by_another_submit_is_not_held_and_the_replay_says_so() -> None:
    # b and b2 both wait for one removal of c; b2 was recorded first. Held
    # for b, the removal would hold b2's own submit too, for ever.
    events = [
        *WAITED[:4],
        wait(1.25, "b2"),
        *WAITED[4:7],
        submit(1.6, "b2", "c"),
        start(1.6, "b2"),
        submit(1.6, "b", "c"),
        finish(2.5, "x"),
        finish(2.6, "b2"),
        start(2.6, "b"),
        finish(3.6, "b"),
        {"t": 4.0, "event": "shutdown"},
    ]
    text = trace_text(events)
    workload, slow, fast = both(text)
    assert workload.unheld == (("b", 1.2),)
    assert_as_recorded(text, slow.trace)  # b2's hold keeps c busy for the skip
    for line in (summary(slow), summary(fast)):
        assert "1 submit(s) that waited for a sweep's removal" in line
        assert "not held (the first: b, from t=1.200)" in line


def test_a_what_if_without_repositories_holds_nothing() -> None:
    # Nothing to remove, nothing to wait for: s goes in as a submit.
    _, slow, _ = both(trace_text(WAITED), config=REPO)
    assert "removal_wait" not in slow.trace
    assert '"event":"skip"' not in slow.trace


def test_a_removal_wait_names_its_run() -> None:
    text = trace_text([{"t": 1.0, "event": "removal_wait", "run_id": 7}])
    with pytest.raises(TraceFormatError, match=r"recorded:2: run_id: expected a string, got 7"):
        list(read_trace_text(text, "recorded")[1])


@st.composite
def recordings(draw: st.DrawFn) -> str:
    """Synthetic recordings of submits, skips and waits for removals in two conversations.

    A wait's submit comes a few events later; what comes between may be
    anything, submits to the same conversation included (which no
    recording holds, but a replay must not hang on).
    """
    events: list[dict[str, Any]] = []
    pending: list[tuple[int, dict[str, Any]]] = []  # (events until its submit, submit)
    t = 0.0
    for n in range(draw(st.integers(1, 16))):
        t += draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
        for due in [p for p in pending if p[0] <= n]:
            pending.remove(due)
            events.append({**due[1], "t": t})
        what = draw(st.sampled_from(["submit", "submit", "skip", "wait"]))
        event = submit(
            t, f"r{n}", draw(st.sampled_from(["c1", "c2"])), "skip" if what == "skip" else "submit"
        )
        event["duration"] = draw(st.sampled_from([0.25, 1.0, 3.0]))
        event["outcome"] = "succeeded"
        if what == "wait":
            events.append(wait(t, f"r{n}"))
            pending.append((n + draw(st.integers(1, 4)), event))
        else:
            events.append(event)
    t += 1.0
    events += [{**p[1], "t": t} for p in pending]
    return trace_text(events)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recordings())
def test_the_engines_agree_on_waits_for_removals_and_the_replay_never_hangs(text: str) -> None:
    both(text)  # a hold the driver waited on for ever would raise Stuck
