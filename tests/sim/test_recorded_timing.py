"""A replay that starts a recorded run in answer to the same event ends it at the recorded moment.

The real supervisor starts a run a few milliseconds after the event that let
it start, and not always right behind it in the trace: the runs of one batch
are all submitted before the first starts, and a start taken late may come
after an unrelated finish. The replay starts a run at once. If it timed the
run from the wrong event, two close finishes would come out swapped and the
replay would start the next runs in another order, or on other accounts,
than the recording did (a flaky tests/integration/supervisor fidelity test
under load). These hand-written recordings make those moments wide.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import config_json

from herdsman.config import LoadedConfig
from herdsman.sim.decisions import read_decisions, timeline_of
from herdsman.sim.diff import first_divergence, report
from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.result import ReplayResult
from herdsman.sim.workload import RecordedAttempt, Workload, config_from_trace, read_workload
from herdsman.trace import read_trace_text

SIM = Path(__file__).parents[2] / "sim"

Engine = Callable[[Workload, LoadedConfig], ReplayResult]
ENGINES: dict[str, Engine] = {"trio": replay, "fast": fast_replay}

# Two slots; in the first test, two accounts of one slot each.
ACCOUNTS = """\
[supervisor]
state_dir = "/s"
[providers.p]
exec = ["x"]
concurrency = 2
[[providers.p.accounts]]
name = "a"
concurrency = 1
[[providers.p.accounts]]
name = "b"
concurrency = 1
"""

TWO_PROVIDERS = """\
[supervisor]
state_dir = "/s"
[providers.p]
exec = ["x"]
concurrency = 2
[providers.q]
exec = ["y"]
concurrency = 1
"""

# The fidelity test's two providers: p with two slots, y with two accounts
# of one slot each.
BATCHES = """\
[supervisor]
state_dir = "/s"
[providers.p]
exec = ["x"]
concurrency = 2
[providers.y]
exec = ["y"]
concurrency = 2
[[providers.y.accounts]]
name = "a"
concurrency = 1
[[providers.y.accounts]]
name = "b"
concurrency = 1
"""


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def submit(t: float, run_id: str, provider: str, conversation: str) -> dict[str, Any]:
    """A recorded submit."""
    run = {"id": run_id, "provider": provider, "conversation": conversation}
    return {"t": t, "event": "submit", "run": run}


def start(t: float, run_id: str, account: str | None = None) -> dict[str, Any]:
    """A recorded start."""
    return {"t": t, "event": "start", "run_id": run_id, "account": account}


def finish(t: float, run_id: str, ended: float | None = None) -> dict[str, Any]:
    """A recorded finish of a run that succeeded; ``ended``: when its end was read."""
    event = {"t": t, "event": "finish", "run_id": run_id, "outcome": "succeeded", "exit_code": 0}
    if ended is not None:
        event["ended"] = ended
    return event


def recording(path: Path, config: str, events: list[dict[str, Any]]) -> Path:
    """Write a recorded trace of ``events`` (numbered in order) under ``config``."""
    header = {
        "herdsman_trace": 1,
        "started_at": "2026-11-29T12:00:00.000000Z",
        "config": config_json(config),
    }
    lines = [header] + [{"t": e["t"], "seq": n, **e} for n, e in enumerate(events)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def events_of(text: str) -> list[dict[str, Any]]:
    """The events of a trace held in memory."""
    return [json.loads(line) for line in text.splitlines()[1:]]


def starts(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """Each start's run and account, in order."""
    return [(e["run_id"], e["account"]) for e in events if e["event"] == "start"]


def finishes(events: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """Each finish's time and run, in order."""
    return [(e["t"], e["run_id"]) for e in events if e["event"] == "finish"]


def replayed_text(trace: Path, engine: str) -> str:
    """The trace ``engine`` writes replaying ``trace`` under its own configuration."""
    workload = read_workload(trace)
    loaded = config_from_trace(workload.header.config, "h")
    return ENGINES[engine](workload, loaded).trace


def replayed(trace: Path, engine: str) -> list[dict[str, Any]]:
    """The events of ``trace`` replayed by ``engine`` under its own configuration."""
    return events_of(replayed_text(trace, engine))


@pytest.mark.parametrize("engine", ENGINES)
def test_runs_submitted_in_one_batch_end_at_their_recorded_moments(
    tmp_path: Path, engine: str
) -> None:
    # Both starts come after the whole batch (the last submit at 4.2 ms);
    # the replay starts r1 at its own submit, 4.2 ms sooner. Timed from the
    # last submit, r1 would end at 997.8 ms, before r2 (1000 ms): r3 would
    # then start before r4, on account a.
    events = [
        submit(0.0, "r1", "p", "c1"),
        submit(0.004, "r2", "p", "c2"),
        submit(0.0041, "r3", "p", "c1"),
        submit(0.0042, "r4", "p", "c2"),
        start(0.006, "r1", "a"),
        start(0.0061, "r2", "b"),
        finish(1.0, "r2"),
        start(1.0002, "r4", "b"),
        finish(1.002, "r1"),
        start(1.0022, "r3", "a"),
        finish(2.0, "r4"),
        finish(2.1, "r3"),
    ]
    trace = recording(tmp_path / "batch.jsonl", ACCOUNTS, events)
    out = replayed(trace, engine)
    assert starts(out) == [("r1", "a"), ("r2", "b"), ("r4", "b"), ("r3", "a")]
    assert finishes(out) == [(1.0, "r2"), (1.002, "r1"), (2.0, "r4"), (2.1, "r3")]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_started_late_behind_another_finish_ends_at_its_recorded_moment(
    tmp_path: Path, engine: str
) -> None:
    # x1 could start at its submit (300 ms: a slot was free); the supervisor
    # got to it only at 304 ms, after q's run ended at 303 ms. The replay
    # starts it at 300 ms: timed from that finish, x1 would end at 998 ms,
    # before a1 (1000 ms), and x2 would start before a2.
    events = [
        submit(0.0, "a1", "p", "a"),
        start(0.001, "a1"),
        submit(0.1, "b1", "q", "b"),
        start(0.101, "b1"),
        submit(0.2, "a2", "p", "a"),
        submit(0.3, "x1", "p", "x"),
        finish(0.303, "b1"),
        start(0.304, "x1"),
        submit(0.31, "x2", "p", "x"),
        finish(1.0, "a1"),
        start(1.0001, "a2"),
        finish(1.001, "x1"),
        start(1.0011, "x2"),
        finish(2.0, "a2"),
        finish(2.1, "x2"),
    ]
    trace = recording(tmp_path / "late.jsonl", TWO_PROVIDERS, events)
    out = replayed(trace, engine)
    assert starts(out) == [(r, None) for r in ("a1", "b1", "x1", "a2", "x2")]
    assert finishes(out) == [(0.303, "b1"), (1.0, "a1"), (1.001, "x1"), (2.0, "a2"), (2.1, "x2")]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_what_if_that_starts_a_run_much_sooner_keeps_its_recorded_duration(
    tmp_path: Path, engine: str
) -> None:
    # Recorded with one slot: r2 waited for r1 and ran from 10.0 to 15.0.
    # With two slots it starts at its submit (1.0), far outside the moments
    # its recorded start could have answered: it takes its 5 s, not 14.
    events = [
        submit(0.0, "r1", "p", "c1"),
        start(0.001, "r1"),
        submit(1.0, "r2", "p", "c2"),
        finish(10.0, "r1"),
        start(10.001, "r2"),
        finish(15.0, "r2"),
    ]
    trace = recording(tmp_path / "what-if.jsonl", TWO_PROVIDERS.replace("= 2", "= 1", 1), events)
    workload = read_workload(trace)
    two = config_from_trace(workload.header.config, "h", ["providers.p.concurrency=2"])
    out = events_of(ENGINES[engine](workload, two).trace)
    assert finishes(out) == [(6.0, "r2"), (10.0, "r1")]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_what_if_start_before_the_start_decided_ahead_of_it_keeps_its_duration(
    tmp_path: Path, engine: str
) -> None:
    # Recorded with one slot: r2 started at 9.901, r3 behind it at 10.201.
    # r3's start answered something after r2's was decided (9.901): with
    # three slots it starts at its submit (9.8), before that, so it takes its
    # 1 s (from r2's finish, which its recorded start answered), not 1.4 s.
    events = [
        submit(0.0, "r1", "p", "c1"),
        start(0.001, "r1"),
        submit(9.7, "r2", "p", "c2"),
        submit(9.8, "r3", "p", "c3"),
        finish(9.9, "r1"),
        start(9.901, "r2"),
        finish(10.2, "r2"),
        start(10.201, "r3"),
        finish(11.2, "r3"),
    ]
    trace = recording(tmp_path / "what-if.jsonl", TWO_PROVIDERS.replace("= 2", "= 1", 1), events)
    workload = read_workload(trace)
    three = config_from_trace(workload.header.config, "h", ["providers.p.concurrency=3"])
    out = events_of(ENGINES[engine](workload, three).trace)
    assert starts(out) == [("r1", None), ("r2", None), ("r3", None)]
    # r2 starts at 9.7, within 0.5 s of its recorded start and after r1's:
    # it ends where it ended.
    assert finishes(out) == [(9.9, "r1"), (10.2, "r2"), (10.8, "r3")]


def test_the_recorded_demo_replays_with_its_recorded_finish_times() -> None:
    # Recorded by a real supervisor (sim/record_demo.py): two batches of
    # submits, each run's start a few milliseconds behind its batch.
    recorded = events_of((SIM / "demo-recorded.jsonl").read_text(encoding="utf-8"))
    golden = events_of((SIM / "demo-recorded.golden.jsonl").read_text(encoding="utf-8"))
    assert finishes(golden) == finishes(recorded)


@pytest.mark.parametrize("engine", ENGINES)
def test_runs_started_long_after_their_submit_behind_another_batch_end_as_recorded(
    tmp_path: Path, engine: str
) -> None:
    # Under load the first batch's starts were traced 0.86 s after their
    # submits, the second batch's submits between. The replay starts x0 and
    # x1 at their submits: timed from the second batch's submit, x0 would end
    # at 0.66 s, before that submit, and x0-again would start before y0 (on
    # no account, where the recording started y0 on a): the fidelity test's
    # failure under load, in its own event order.
    events = [
        submit(0.1388, "x0", "p", "x0"),
        submit(0.1389, "x1", "p", "x1"),
        submit(0.139, "x0-again", "p", "x0"),
        submit(0.9539, "y0", "y", "y0"),
        submit(0.954, "y1", "y", "y1"),
        start(0.9982, "x0"),
        start(0.9983, "x1"),
        start(1.2142, "y0", "a"),
        start(1.2145, "y1", "b"),
        finish(1.4776, "x0"),
        start(1.4778, "x0-again"),
        finish(1.489, "x1"),
        finish(1.6807, "y1"),
        finish(1.7252, "y0"),
        finish(1.9122, "x0-again"),
    ]
    trace = recording(tmp_path / "late-batch.jsonl", BATCHES, events)
    out = replayed(trace, engine)
    assert starts(out) == [
        ("x0", None),
        ("x1", None),
        ("y0", "a"),
        ("y1", "b"),
        ("x0-again", None),
    ]
    assert finishes(out) == [(e["t"], e["run_id"]) for e in events if e["event"] == "finish"]


# The fidelity test's order of events as a real supervisor traced it under
# load (load 12 to 14), every finish given when its end was read: the first
# two demo runs ended about 1.24 s in, while the second batch's submits were
# being committed; their finishes were queued behind those submits and
# traced 0.25 s later, and the starts their slots allowed, decided as they
# were read, with them; the second batch's starts, decided once its submits
# were committed, after those. Every other end was read 2 ms before its line.
LATE_FINISHES = [
    submit(0.504784, "x0", "p", "x0"),
    submit(0.50488, "x1", "p", "x1"),
    submit(0.504895, "x0-again", "p", "x0"),
    submit(0.504917, "x2", "p", "x2"),
    submit(0.504929, "x1-again", "p", "x1"),
    submit(0.504941, "x3", "p", "x3"),
    submit(0.504953, "x3-again", "p", "x3"),
    submit(0.504974, "x2-again", "p", "x2"),
    start(0.543468, "x0"),
    start(0.543718, "x1"),
    submit(1.241604, "y0", "y", "y0"),
    submit(1.241694, "y1", "y", "y1"),
    submit(1.241708, "y0-again", "y", "y0"),
    submit(1.241718, "y2", "y", "y2"),
    submit(1.241727, "y1-again", "y", "y1"),
    submit(1.241743, "y2-again", "y", "y2"),
    finish(1.496693, "x0", ended=1.2409),
    start(1.496854, "x0-again"),
    finish(1.496924, "x1", ended=1.2411),
    start(1.496937, "x2"),
    start(1.547975, "y0", "a"),
    start(1.548151, "y1", "b"),
    finish(2.174569, "x2", ended=2.172569),
    start(2.174653, "x1-again"),
    finish(2.174722, "y1", ended=2.172722),
    start(2.174834, "y2", "b"),
    finish(2.23797, "y0", ended=2.23597),
    start(2.238047, "y0-again", "a"),
    finish(2.727633, "x0-again", ended=2.725633),
    start(2.727694, "x3"),
    finish(2.791554, "y2", ended=2.789554),
    start(2.791604, "y1-again", "b"),
    finish(2.835556, "y0-again", ended=2.833556),
    start(2.83567, "y2-again", "a"),
    finish(2.835725, "x1-again", ended=2.833725),
    start(2.835741, "x2-again"),
    finish(3.307474, "x3", ended=3.305474),
    start(3.307548, "x3-again"),
    finish(3.416213, "y1-again", ended=3.414213),
    finish(3.463561, "x2-again", ended=3.461561),
    finish(3.463627, "y2-again", ended=3.461627),
    finish(3.831835, "x3-again", ended=3.829835),
    {"t": 5.058739, "event": "shutdown"},
]


@pytest.mark.parametrize("engine", ENGINES)
def test_finishes_traced_late_behind_a_batch_of_submits_end_when_their_end_was_read(
    tmp_path: Path, engine: str
) -> None:
    # Ended at their lines' time, x0 and x1 would end after the second
    # batch's submits: the replay would start y0 and y1 first, where the
    # recording started x0-again and x2 (diverging at decision 2, the
    # kept trace's failure under load).
    trace = recording(tmp_path / "late-finishes.jsonl", BATCHES, LATE_FINISHES)
    text = replayed_text(trace, engine)
    recorded = read_decisions(trace)
    again = timeline_of(read_trace_text(text, "replayed")[1])
    divergence = first_divergence(recorded, again)
    assert divergence is None, report(divergence, recorded, again, ("recorded", "replayed"))
    # Each attempt ends when its end was read, as the recorded supervisor decided.
    assert finishes(events_of(text)) == [
        (e["ended"], e["run_id"]) for e in LATE_FINISHES if e["event"] == "finish"
    ]


def test_a_finish_without_ended_still_ends_at_its_line(tmp_path: Path) -> None:
    # A trace written before finishes said when their end was read: each
    # attempt ends at its finish's time, as before.
    events = [{key: value for key, value in e.items() if key != "ended"} for e in LATE_FINISHES]
    trace = recording(tmp_path / "old.jsonl", BATCHES, events)
    ends = [
        (attempt.ends_at, run_id)
        for run_id, plan in read_workload(trace).plans.items()
        for attempt in plan.attempts
        if isinstance(attempt, RecordedAttempt)
    ]
    assert sorted(ends) == sorted(finishes(events))
