"""The trace writer and reader agree, rotate and reject malformed lines precisely."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path

import pytest

from herdsman.trace import TraceFormatError, TraceWriter, read_trace

WALL = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def writer(tmp_path: Path, clock: FakeClock, max_bytes: int = 1 << 20) -> TraceWriter:
    return TraceWriter(
        tmp_path,
        max_bytes=max_bytes,
        config={"providers": {"demo": {"concurrency": 2}}},
        clock=clock,
        wall=lambda: WALL,
    )


def test_written_events_read_back_in_order(tmp_path: Path) -> None:
    clock = FakeClock()
    w = writer(tmp_path, clock)
    w.event("submit", run={"id": "r0", "provider": "demo", "conversation": "c"})
    clock.now += 1.5
    w.event("start", run_id="r0", account=None)
    clock.now += 2
    w.event("finish", run_id="r0", outcome="succeeded", exit_code=0)
    w.close()
    assert w.path is not None
    header, events = read_trace(w.path)
    assert header.started_at == "2026-11-29T12:00:00.000000Z"
    assert header.config == {"providers": {"demo": {"concurrency": 2}}}
    assert header.carry is None
    got = [(e.t, e.seq, e.event) for e in events]
    assert got == [(0.0, 0, "submit"), (1.5, 1, "start"), (3.5, 2, "finish")]


def test_lines_are_compact_and_byte_stable(tmp_path: Path) -> None:
    clock = FakeClock()
    w = writer(tmp_path, clock)
    w.event("cancel", run_id="r0")
    w.close()
    assert w.path is not None
    lines = w.path.read_text(encoding="utf-8").splitlines()
    assert lines[1] == '{"t":0.0,"seq":0,"event":"cancel","run_id":"r0"}'


def test_rotation_starts_a_new_self_contained_file(tmp_path: Path) -> None:
    clock = FakeClock()
    w = writer(tmp_path, clock, max_bytes=300)
    w.event("submit", run={"id": "r0", "provider": "demo", "conversation": "c"})
    w.event("start", run_id="r0", account="a")
    w.event("submit", run={"id": "r1", "provider": "demo", "conversation": "c"})
    w.event("submit", run={"id": "r2", "provider": "demo"})
    w.event("cancel", run_id="r2")
    for n in range(10):
        clock.now += 1
        w.event("skip", run={"id": f"s{n}", "provider": "demo"})
    w.event("finish", run_id="r0", outcome="usage_limited", exit_code=1, requeued=True)
    for n in range(10, 15):
        w.event("skip", run={"id": f"s{n}", "provider": "demo"})
    w.close()
    files = sorted(tmp_path.glob("trace-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    assert len(files) > 2
    seen = []
    carries = []
    for number, path in enumerate(files):
        header, events = read_trace(path)
        assert (header.carry is None) == (number == 0)
        carries.append(header.carry)
        evs = list(events)
        assert evs[0].t == 0.0
        assert evs[0].seq == 0
        # Every file but the last ends by naming the next one.
        if number < len(files) - 1:
            assert (evs[-1].event, evs[-1].fields) == ("rotated", {"next": files[number + 1].name})
        seen += [e.fields["run"]["id"] for e in evs if e.event == "skip"]
    assert seen == [f"s{n}" for n in range(15)]
    r0 = {"id": "r0", "provider": "demo", "conversation": "c"}
    r1 = {"id": "r1", "provider": "demo", "conversation": "c"}
    # As the events written before it tell: r2 was cancelled, r0 ran on
    # account a until its re-queue put it back among the queued, first.
    assert {"running": [{"run": r0, "account": "a"}], "queued": [r1], "rests": []} in carries
    assert carries[-1] == {"running": [], "queued": [r0, r1], "rests": []}


def test_a_sink_is_one_file_never_rotated(tmp_path: Path) -> None:
    clock = FakeClock()
    sink = io.StringIO()
    w = TraceWriter(tmp_path, max_bytes=4096, config={}, clock=clock, wall=lambda: WALL, sink=sink)
    for n in range(100):
        w.event("skip", run={"id": f"s{n}", "provider": "demo"})
    w.close()
    assert list(tmp_path.iterdir()) == []
    lines = sink.getvalue().splitlines()
    assert len(lines) == 101
    assert all('"rotated"' not in line for line in lines)


@pytest.mark.parametrize(
    ("carry", "message"),
    [
        ([], "carry: expected an object"),
        ({"waiting": []}, "carry: unknown field 'waiting'"),
        ({"queued": {}}, r"carry.queued: expected a list"),
        ({"queued": [{"provider": "p"}]}, r"carry.queued\[0\].id: expected a non-empty string"),
        ({"running": [{"account": "a"}]}, r"carry.running\[0\]: expected \{run, account\}"),
        ({"rests": [[]]}, r"carry.rests\[0\]: expected \{provider, account, until\}"),
        (
            {"rests": [{"provider": "p", "account": None, "until": "soon"}]},
            r"carry.rests\[0\].until: expected unix seconds, got 'soon'",
        ),
        (
            {"rests": [{"provider": "", "account": None, "until": 1.0}]},
            r"carry.rests\[0\].provider: expected a non-empty string",
        ),
        (
            {"running": [{"run": {"id": "r", "provider": "p"}, "account": 3}]},
            r"carry.running\[0\].account: expected a string or null, got 3",
        ),
    ],
)
def test_a_malformed_carry_is_named_in_the_error(
    tmp_path: Path, carry: object, message: str
) -> None:
    header = {"herdsman_trace": 1, "started_at": "2026-11-29T12:00:00Z", "config": {}}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({**header, "carry": carry}) + "\n", encoding="utf-8")
    with pytest.raises(TraceFormatError, match=rf"t.jsonl:1: {message}"):
        read_trace(path)
