"""A fleet's members' traces replayed together (``herdsman sim replay A B C --out-dir DIR``).

The inputs are sim/fleet-m*.jsonl, three real members recorded on a real
PostgreSQL ledger by sim/record_fleet.py (the recording itself is tested in
tests/integration/supervisor/test_replay_fleet.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import herdsman

from herdsman.sim.decisions import read_decisions, timeline_of
from herdsman.sim.diff import first_divergence, report
from herdsman.sim.fleet_members import _inputs
from herdsman.sim.fleet_replay import FleetReplayResult, fleet_replay, read_member
from herdsman.sim.workload import config_from_trace
from herdsman.trace import TraceFormatError, read_trace_text

SIM = Path(__file__).parents[2] / "sim"
NAMES = ("fleet-m0", "fleet-m1", "fleet-m2")
#: What a fleet's trace says beyond a lone supervisor's (recorded since this replay exists).
FLEET_EVENTS = frozenset({"fleet_submit", "fleet_cancel", "poll", "claim_refused"})


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logger = logging.getLogger("herdsman")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def replayed(paths: Sequence[Path], seed: int | None = None) -> FleetReplayResult:
    members = [read_member(path) for path in paths]
    configs = [config_from_trace(m.workload.header.config, m.name) for m in members]
    return fleet_replay(members, configs, seed=seed)


def shipped(names: Sequence[str] = NAMES) -> list[Path]:
    return [SIM / f"{name}.jsonl" for name in names]


def test_the_shipped_fleet_replays_to_its_golden_outputs_with_every_decision() -> None:
    result = replayed(shipped())
    assert result.notes == ()
    for name, text in zip(NAMES, result.traces, strict=True):
        assert text == (SIM / f"{name}.golden.jsonl").read_text(encoding="utf-8"), name
        expected = read_decisions(SIM / f"{name}.jsonl")
        got = timeline_of(read_trace_text(text, name)[1])
        divergence = first_divergence(expected, got)
        assert divergence is None, report(divergence, expected, got, (name, "replay"))
        assert expected.decisions, name  # each member decided something


def test_the_shipped_fleet_holds_what_a_fleet_replay_needs() -> None:
    kinds = [
        json.loads(line)
        for path in shipped()
        for line in path.read_text(encoding="utf-8").splitlines()[1:]
    ]
    events = {event["event"] for event in kinds}
    assert FLEET_EVENTS | {"skip", "start", "finish", "shutdown"} <= events
    assert any(e["event"] == "poll" and e.get("parked") for e in kinds)  # claims refused
    assert any(e["event"] == "poll" and e["left"] for e in kinds)  # taken elsewhere


@pytest.mark.parametrize("seed", [1, 2])
def test_trio_s_wake_up_order_changes_nothing(seed: int) -> None:
    assert replayed(shipped(), seed=seed).traces == replayed(shipped()).traces


def test_a_member_missing_is_named_first_with_the_event_that_shows_it() -> None:
    result = replayed(shipped(("fleet-m0", "fleet-m1")))
    first, *later = result.notes
    # A run submitted to m2 that a given member polled, named where it polled it.
    words = first.split()
    assert words[2:3] == ["run"]
    assert words[3] in _submits_of(SIM / "fleet-m2.jsonl")
    assert " was submitted to a member whose trace is not given " in first
    assert words[1].startswith(str(SIM / "fleet-m"))  # the file and line of the poll
    assert words[1].split(":")[-2].isdigit()
    cause = "a member is missing from the traces given (the note on the first such run)"
    assert all(note.endswith(cause) for note in later)
    assert all("\n" not in note for note in result.notes)
    # The members given claimed as recorded: the missing one's runs went
    # into the ledger where they polled them, so their decisions still hold.
    for name, text in zip(("fleet-m0", "fleet-m1"), result.traces, strict=True):
        expected = read_decisions(SIM / f"{name}.jsonl")
        got = timeline_of(read_trace_text(text, name)[1])
        assert first_divergence(expected, got) is None, name


def _submits_of(path: Path) -> set[str]:
    """The runs submitted to the member that recorded ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    return {
        event["run"]["id"] for event in map(json.loads, lines) if event["event"] == "fleet_submit"
    }


def test_traces_recorded_before_fleet_events_say_so(tmp_path: Path) -> None:
    paths = []
    for path in shipped():
        lines = path.read_text(encoding="utf-8").splitlines()
        kept = [lines[0]] + [
            line for line in lines[1:] if json.loads(line)["event"] not in FLEET_EVENTS
        ]
        old = tmp_path / path.name
        old.write_text("\n".join(kept) + "\n", encoding="utf-8")
        paths.append(old)
    notes = replayed(paths).notes
    assert notes
    assert "hold no fleet_submit or poll events" in notes[0]


def test_a_member_s_new_trace_alone_replays_as_one_supervisor_as_before(tmp_path: Path) -> None:
    done = herdsman("sim", "replay", str(SIM / "fleet-m0.jsonl"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "this is a fleet member's trace" in done.stderr
    events = [json.loads(line)["event"] for line in done.stdout.splitlines()[1:]]
    assert "start" in events
    assert FLEET_EVENTS.isdisjoint(events)  # a lone supervisor polls no fleet


def test_the_command_writes_each_member_s_replay_under_its_name(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    done = herdsman("sim", "replay", *map(str, shipped()), "--out-dir", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("replayed 14 runs of 3 fleet members together over ")
    assert done.stdout == ""
    for name in NAMES:
        diff = herdsman(
            "sim", "diff", str(SIM / f"{name}.jsonl"), str(out / f"{name}.jsonl"), cwd=tmp_path
        )
        assert diff.returncode == 0, diff.stdout
        assert diff.stdout.startswith("the traces agree on all")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--engine", "fast"], "a fleet's traces replay with the trio engine"),
        (["--out", "x.jsonl"], "give --out-dir DIR"),
        ([], "several traces replay together as one fleet's members: give --out-dir DIR"),
        (["--out-dir", "missing"], "--out-dir missing: no such directory"),
    ],
)
def test_a_fleet_replay_misused_is_one_line_and_exit_2(
    tmp_path: Path, extra: list[str], says: str
) -> None:
    done = herdsman("sim", "replay", *map(str, shipped()), *extra, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert says in done.stderr
    assert done.stdout == ""


def test_a_trace_that_is_not_a_fleet_member_s_is_refused_by_name(tmp_path: Path) -> None:
    lone = SIM / "demo-recorded.jsonl"
    done = herdsman(
        "sim", "replay", str(SIM / "fleet-m0.jsonl"), str(lone), "--out-dir", ".", cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"herdsman: {lone}:1: config.fleet.enabled: this trace is not a fleet member's;"
        " several traces replay together only as the members of one fleet\n"
    )


def test_two_traces_of_one_name_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    copy = tmp_path / "a" / "fleet-m0.jsonl"
    copy.write_text((SIM / "fleet-m0.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    done = herdsman(
        "sim", "replay", str(SIM / "fleet-m0.jsonl"), str(copy), "--out-dir", ".", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "two traces given have the same file name" in done.stderr


def test_a_rotated_member_file_is_refused(tmp_path: Path) -> None:
    lines = (SIM / "fleet-m0.jsonl").read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header["carry"] = {"running": [], "queued": [], "rests": []}
    rotated = tmp_path / "rotated.jsonl"
    rotated.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    with pytest.raises(TraceFormatError, match=r"rotated.jsonl:1: carry: a rotated member file"):
        read_member(rotated)


def test_a_what_if_polls_on_the_members_timers_and_says_so() -> None:
    members = [read_member(path) for path in shipped()]
    configs = [
        config_from_trace(m.workload.header.config, m.name, ["providers.demo.concurrency=1"])
        for m in members
    ]
    result = fleet_replay(members, configs, what_if=True)
    assert result.notes == (
        "t=0.000 a what-if configuration is given: the members poll on their own timers,"
        " not at their recorded polls",
    )
    starts = [
        event.fields["run_id"]
        for text in result.traces
        for event in read_trace_text(text, "replayed")[1]
        if event.event == "start"
    ]
    # Every run but the skipped and the cancelled one, once, one slot a member.
    assert sorted(starts) == [f"f{n:02}" for n in range(14) if n not in (5, 6)]


def test_a_member_whose_trace_just_ends_is_killed_there_and_said_so(tmp_path: Path) -> None:
    paths = []
    for path in shipped():
        lines = path.read_text(encoding="utf-8").splitlines()
        if path.name == "fleet-m1.jsonl":
            # Killed with a run running: the file ends after its last start.
            last = max(n for n, line in enumerate(lines) if '"event":"start"' in line)
            lines = lines[: last + 1]
        cut = tmp_path / path.name
        cut.write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(cut)
    result = replayed(paths)
    [note] = result.notes
    words = note.split()
    assert words[1] == f"{paths[1]}:{last + 1}:"
    assert "the trace ends here with runs running and no shutdown" in note
    events = [e.event for e in read_trace_text(result.traces[1], "m1")[1]]
    assert "shutdown" not in events  # killed: nothing more written
    for path, text in zip(paths, result.traces, strict=True):
        expected = read_decisions(path)
        got = timeline_of(read_trace_text(text, path.name)[1])
        assert first_divergence(expected, got) is None, path.name


def test_a_finish_traced_behind_a_poll_ends_when_its_end_was_read(tmp_path: Path) -> None:
    # m0 as a member under load would have traced it: f07's end read at
    # 13.96, as the poll that took f13 (queued before it) was being
    # committed, and its finish traced 50 ms after that poll, with it the
    # start of f13, which the poll allowed. Ended at its line's time, f07
    # would end after the poll: the replay would start f13 first, 50 ms
    # before the recorded finish (the fleet test's failure at load 13).
    lines = [json.loads(line) for line in (SIM / "fleet-m0.jsonl").read_text().splitlines()]
    header, events = lines[0], lines[1:]
    [f07] = [e for e in events if e["event"] == "finish" and e["run_id"] == "f07"]
    [f13] = [e for e in events if e["event"] == "start" and e["run_id"] == "f13"]
    events.remove(f07)
    events.insert(events.index(f13), {**f07, "t": 14.0102, "ended": 13.96})
    f13["t"] = 14.010281
    agrees_with_every_member(tmp_path, 0, header, events)


def test_a_member_s_start_decided_by_a_late_timer_is_decided_when_it_was(tmp_path: Path) -> None:
    # m2, given a provider whose two accounts take one run per 2 s: g1
    # starts on a at 10.21, g2 (conversation c9, whose session it leaves on
    # b) on b 5 ms later; g3 of c9 then waits for an account. a comes back
    # at 12.21, b at 12.215; the member's timer, due at a's return, fired
    # 30 ms late: both were back, and g3 kept to b. On time, the replay's
    # timer finds only a back and moves g3 there. No other member's event
    # comes between (they have all shut down by then).
    lines = [json.loads(line) for line in (SIM / "fleet-m2.jsonl").read_text().splitlines()]
    header, events = lines[0], lines[1:]
    providers = header["config"]["providers"]
    paced = {"env": {}, "window": "2s", "budget": 1, "budget_unit": "runs", "concurrency": None}
    accounts = [{"name": name, **paced} for name in ("a", "b")]
    providers["paced"] = {**providers["demo"], "accounts": accounts}
    shutdown = events.pop()
    events += [
        *taken(10.207, "g1", "c8"),
        {"t": 10.2102, "event": "start", "run_id": "g1", "account": "a"},
        *taken(10.212, "g2", "c9"),
        {"t": 10.2152, "event": "start", "run_id": "g2", "account": "b"},
        succeeded(11.0, "g1"),
        {**succeeded(11.2, "g2"), "session": True},
        *taken(11.5, "g3", "c9"),
        {"t": 12.2403, "event": "start", "run_id": "g3", "account": "b", "decided": 12.24},
        succeeded(14.0, "g3"),
        {**shutdown, "t": 16.0},
    ]
    agrees_with_every_member(tmp_path, 2, header, events)


def test_a_member_s_poll_waits_for_the_decision_on_the_runs_it_took(tmp_path: Path) -> None:
    # m2, its two slots: h1 of c8 runs, h3 of c8 waits behind it, one slot
    # free. A poll at 11.003 takes h4; the member's dispatcher, woken by
    # it, resumed late, and h1's end, read at 11.01 meanwhile, decided
    # first: both slots free, h3 and h4 start in the queue's order (both
    # decided 11.01). Delivered at its line, the poll starts h4 at once,
    # in the one free slot, before h1's end: h4, then h3. No other
    # member's event comes between (they have all shut down by then).
    lines = [json.loads(line) for line in (SIM / "fleet-m2.jsonl").read_text().splitlines()]
    header, events = lines[0], lines[1:]
    shutdown = events.pop()
    events += [
        *taken(10.2, "h1", "c8", "demo"),
        {"t": 10.2035, "event": "start", "run_id": "h1", "account": None, "decided": 10.2032},
        *taken(10.5, "h3", "c8", "demo"),
        *taken(11.0, "h4", "c10", "demo"),
        {**succeeded(11.02, "h1"), "ended": 11.01},
        {"t": 11.0202, "event": "start", "run_id": "h3", "account": None, "decided": 11.01},
        {"t": 11.0204, "event": "start", "run_id": "h4", "account": None, "decided": 11.01},
        succeeded(12.0, "h3"),
        succeeded(12.1, "h4"),
        {**shutdown, "t": 14.0},
    ]
    agrees_with_every_member(tmp_path, 2, header, events)


def polls_delivered(tmp_path: Path, events: list[dict[str, Any]]) -> list[tuple[float, Any]]:
    """When a fleet replay delivers m2's polls, its trace edited to ``events`` (its times)."""
    lines = [json.loads(line) for line in (SIM / "fleet-m2.jsonl").read_text().splitlines()]
    path = tmp_path / "m2.jsonl"
    path.write_text(
        "".join(json.dumps(line) + "\n" for line in [lines[0], *renumbered(events)]),
        encoding="utf-8",
    )
    member = read_member(path)
    inputs, _, _ = _inputs([member], [0.0])
    return [(round(i.t, 6), i.fields["runs"]) for i in inputs if i.kind == "poll"]


def test_a_poll_is_held_only_when_nothing_else_comes_first_and_it_only_took_runs(
    tmp_path: Path,
) -> None:
    def start(t: float, run_id: str, decided: float | None = None) -> dict[str, Any]:
        line: dict[str, Any] = {"t": t, "event": "start", "run_id": run_id, "account": None}
        return line if decided is None else {**line, "decided": decided}

    held = [*taken(11.0, "h4", "c10", "demo"), start(11.0204, "h4", 11.01)]
    assert polls_delivered(tmp_path, held) == [(11.01, ["h4"])]
    # Decided at its line (no decided): delivered at the poll's.
    at_once = [*taken(11.0, "h4", "c10", "demo"), start(11.0204, "h4")]
    assert polls_delivered(tmp_path, at_once) == [(11.003, ["h4"])]
    # A submit to the member between: the poll keeps its place before it.
    other = {**taken(11.005, "h5", "c11", "demo")[0]}
    crowded = [*taken(11.0, "h4", "c10", "demo"), other, start(11.0204, "h4", 11.01)]
    assert polls_delivered(tmp_path, crowded) == [(11.003, ["h4"])]
    # A poll that also saw a run leave: that took effect at its line.
    leaving = [*taken(11.0, "h4", "c10", "demo"), start(11.0204, "h4", 11.01)]
    leaving[1] = {**leaving[1], "left": ["h9"]}
    assert polls_delivered(tmp_path, leaving) == [(11.003, ["h4"])]
    # Decided more than half a second later: something untraced held it.
    late = [*taken(11.0, "h4", "c10", "demo"), start(11.6, "h4", 11.59)]
    assert polls_delivered(tmp_path, late) == [(11.003, ["h4"])]


def taken(
    t: float, run_id: str, conversation: str, provider: str = "paced"
) -> list[dict[str, Any]]:
    """A run submitted to this member at ``t`` and taken by its poll 3 ms later."""
    run = {"id": run_id, "provider": provider, "conversation": conversation, "workspace": "default"}
    return [
        {"t": t, "event": "fleet_submit", "run": run},
        {"t": round(t + 0.003, 6), "event": "poll", "runs": [run_id], "left": [], "cancels": []},
        {"t": round(t + 0.0031, 6), "event": "submit", "run": run},
    ]


def succeeded(t: float, run_id: str) -> dict[str, Any]:
    return {"t": t, "event": "finish", "run_id": run_id, "outcome": "succeeded", "exit_code": 0}


def agrees_with_every_member(
    tmp_path: Path, member: int, header: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    """The shipped fleet, its ``member``'s trace edited to ``events``, replays with every
    member's decisions as recorded and no note."""
    paths = shipped()
    paths[member] = tmp_path / paths[member].name
    paths[member].write_text(
        "".join(json.dumps(line) + "\n" for line in [header, *renumbered(events)]),
        encoding="utf-8",
    )
    result = replayed(paths)
    assert result.notes == ()
    for path, text in zip(paths, result.traces, strict=True):
        expected = read_decisions(path)
        got = timeline_of(read_trace_text(text, path.name)[1])
        divergence = first_divergence(expected, got)
        assert divergence is None, report(divergence, expected, got, (path.name, "replay"))


def renumbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` with their ``seq`` counting their lines again."""
    return [{**event, "seq": n} for n, event in enumerate(events)]
