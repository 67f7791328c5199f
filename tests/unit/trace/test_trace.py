"""The trace writer and reader agree, rotate and reject malformed lines precisely."""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from herdsman.trace import TraceFormatError, TraceWriter, read_trace
from herdsman.trace import _FileLines as FileLines

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

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


def test_a_finish_says_when_its_end_was_read_if_before_its_line(tmp_path: Path) -> None:
    clock = FakeClock()
    w = writer(tmp_path, clock)
    w.event("submit", run={"id": "r0", "provider": "demo"})
    w.start("r0", None)
    clock.now += 1
    read = w.now()
    clock.now += 0.25  # its commit took that long
    w.finish("r0", "succeeded", 0, requeued=False, ended=read)
    w.event("submit", run={"id": "r1", "provider": "demo"})
    w.start("r1", None)
    w.finish("r1", "succeeded", 0, requeued=False, ended=w.now())  # read and traced at once
    w.event("submit", run={"id": "r2", "provider": "demo"})
    w.start("r2", None)
    read = w.now()
    clock.now += 1
    w.rotate()  # its line goes to a file begun after it was read
    clock.now += 1
    w.finish("r2", "succeeded", 0, requeued=False, ended=read)
    w.close()
    files = sorted(tmp_path.glob("trace-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    finishes = [
        (e.t, e.fields) for path in files for e in read_trace(path)[1] if e.event == "finish"
    ]
    plain = {"outcome": "succeeded", "exit_code": 0}
    assert finishes == [
        (1.25, {"run_id": "r0", **plain, "ended": 1.0}),
        (1.25, {"run_id": "r1", **plain}),
        (1.0, {"run_id": "r2", **plain}),
    ]


def test_a_start_says_when_it_was_decided_if_before_its_line(tmp_path: Path) -> None:
    clock = FakeClock()
    w = writer(tmp_path, clock)
    w.event("submit", run={"id": "r0", "provider": "demo"})
    clock.now += 1
    decided = w.now()
    clock.now += 0.03  # its commit took that long
    w.start("r0", None, decided)
    w.event("submit", run={"id": "r1", "provider": "demo"})
    w.start("r1", "a", w.now())  # decided and traced at once
    w.event("submit", run={"id": "r2", "provider": "demo"})
    decided = w.now()
    clock.now += 1
    w.rotate()  # its line goes to a file begun after it was decided
    clock.now += 1
    w.start("r2", None, decided)
    w.close()
    files = sorted(tmp_path.glob("trace-*.jsonl"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    starts = [(e.t, e.fields) for path in files for e in read_trace(path)[1] if e.event == "start"]
    assert starts == [
        (1.03, {"run_id": "r0", "account": None, "decided": 1.0}),
        (1.03, {"run_id": "r1", "account": "a"}),
        (1.0, {"run_id": "r2", "account": None}),
    ]


def test_a_start_with_decided_takes_the_record_path_alike(tmp_path: Path) -> None:
    # A run id the shortcut does not take (not a str): written by record.
    clock = FakeClock()
    w = writer(tmp_path, clock)
    w.event("submit", run={"id": "r0", "provider": "demo"})
    clock.now += 2
    decided = w.now()
    clock.now += 0.5
    w.start(_Id("r0"), None, decided)
    w.close()
    (path,) = tmp_path.glob("trace-*.jsonl")
    (event,) = [e for e in read_trace(path)[1] if e.event == "start"]
    assert (event.t, event.fields) == (2.5, {"run_id": "r0", "account": None, "decided": 2.0})


class _Id(str):
    """A run id of a subclass of str: the writer's shortcut takes only str itself."""


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


def test_record_writes_what_event_writes_from_the_same_fields(tmp_path: Path) -> None:
    clock = FakeClock()
    by_keywords, by_dict = writer(tmp_path / "a", clock), writer(tmp_path / "b", clock)
    events: list[tuple[str, dict[str, Any]]] = [
        ("submit", {"run": {"id": "r0", "provider": "demo", "workspace": "default"}}),
        ("start", {"run_id": "r0", "account": None}),
        ("finish", {"run_id": "r0", "outcome": "succeeded", "exit_code": 0}),
    ]
    for kind, fields in events:
        by_keywords.event(kind, **fields)
        by_dict.record(kind, fields)
        clock.now += 0.25
    for w in (by_keywords, by_dict):
        w.close()
    assert by_keywords.path is not None
    assert by_dict.path is not None
    assert by_dict.path.read_bytes() == by_keywords.path.read_bytes()
    with pytest.raises(ValueError, match="unknown trace event 'bogus'"):
        by_dict.record("bogus", {})


def test_unknown_event_kind_is_refused_by_the_writer(tmp_path: Path) -> None:
    w = writer(tmp_path, FakeClock())
    with pytest.raises(ValueError, match="unknown trace event 'bogus'"):
        w.event("bogus")


HEADER = json.dumps(
    {"herdsman_trace": 1, "started_at": "2026-11-29T12:00:00.000000Z", "config": {}}
)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty file, expected a trace header"),
        (["{not json"], ":1: not JSON"),
        (['{"herdsman_trace": 2, "started_at": "x", "config": {}}'], "expected trace format 1"),
        ([HEADER, '{"t": -1, "seq": 0, "event": "cancel", "run_id": "r"}'], ":2: t: expected"),
        (
            [
                HEADER,
                '{"t": 2, "seq": 0, "event": "cancel", "run_id": "r"}',
                '{"t": 1, "seq": 1, "event": "cancel", "run_id": "r"}',
            ],
            ":3: t: went backwards from 2.0 to 1",
        ),
        ([HEADER, '{"t": 0, "seq": 0, "event": "launch"}'], ":2: event: expected one of"),
        ([HEADER, '{"t": 0, "seq": 0, "event": "finish", "run_id": "r"}'], "missing outcome"),
        (
            [HEADER, '{"t": 0, "seq": 0, "event": "submit", "run": {"id": "r"}}'],
            ":2: run.provider: expected a non-empty string",
        ),
        (
            [HEADER, '{"t":0,"seq":0,"event":"submit","run":{"id":"r","provider":"p","x":1}}'],
            ":2: run: unknown field 'x'",
        ),
        (
            [HEADER.replace('"config": {}', '"config": {}, "generator": [1]')],
            ":1: generator: expected an object",
        ),
        (
            [HEADER, '{"t": 0, "seq": 0, "event": "rest_ended", "provider": 3, "account": null}'],
            ":2: rest_ended: expected a provider name and an account name or null",
        ),
        (
            [
                HEADER,
                '{"t":0,"seq":0,"event":"submit","run":{"id":"r","provider":"p","cwd":"a/b"}}',
            ],
            ":2: run.cwd: expected an absolute path, got 'a/b'",
        ),
        (
            [HEADER, '{"t":0,"seq":0,"event":"poll","runs":"r1","left":[],"cancels":[]}'],
            ":2: runs: expected a list of run ids, got 'r1'",
        ),
        ([HEADER, '{"t":0,"seq":0,"event":"poll","runs":[]}'], ":2: poll: missing cancels, left"),
        (
            [HEADER, '{"t":0,"seq":0,"event":"fleet_cancel","run_id":7}'],
            ":2: run_id: expected a string, got 7",
        ),
        (
            [
                HEADER,
                '{"t":1.5,"seq":0,"event":"finish","run_id":"r","outcome":"failed",'
                '"exit_code":1,"ended":1.75}',
            ],
            r":2: ended: expected seconds >= 0, no later than the line's t \(1.5\), got 1.75",
        ),
        (
            [
                HEADER,
                '{"t":1.5,"seq":0,"event":"finish","run_id":"r","outcome":"failed",'
                '"exit_code":1,"ended":"1.25"}',
            ],
            ":2: ended: expected seconds >= 0",
        ),
        (
            [
                HEADER,
                '{"t":0,"seq":0,"event":"submit","run":{"id":"r","provider":"p"}}',
                '{"t":1.5,"seq":1,"event":"start","run_id":"r","account":null,"decided":2}',
            ],
            r":3: decided: expected seconds >= 0, no later than the line's t \(1.5\), got 2",
        ),
        (
            [
                HEADER,
                '{"t":0,"seq":0,"event":"submit","run":{"id":"r","provider":"p"}}',
                '{"t":1.5,"seq":1,"event":"start","run_id":"r","account":null,"decided":null}',
            ],
            ":3: decided: expected seconds >= 0",
        ),
    ],
)
def test_malformed_traces_name_the_line_and_the_fault(
    tmp_path: Path, lines: list[str], message: str
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")

    def read_all() -> None:
        _header, events = read_trace(path)
        list(events)

    with pytest.raises(TraceFormatError, match=message) as info:
        read_all()
    assert str(info.value).startswith(str(path))


def test_missing_trace_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="cannot read trace: No such file"):
        read_trace(tmp_path / "nope.jsonl")


def test_a_write_error_stops_the_trace_but_not_the_caller(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    w = writer(tmp_path / "traces", clock, max_bytes=4096)
    w.open()
    w.event("cancel", run_id="r0")
    w.close()
    # The folder is replaced by a file: the next rotation cannot open anything.
    for path in (tmp_path / "traces").iterdir():
        path.unlink()
    (tmp_path / "traces").rmdir()
    (tmp_path / "traces").write_text("not a folder")
    w.event("cancel", run_id="r1")
    w.event("cancel", run_id="r2")
    assert w.failed == 2
    assert "the trace stops here" in caplog.text


def test_open_reports_an_unusable_folder_at_once(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    w = writer(tmp_path / "file" / "traces", FakeClock())
    with pytest.raises(OSError, match="Not a directory"):
        w.open()


def test_a_second_writer_in_the_same_second_never_overwrites_the_first(tmp_path: Path) -> None:
    first = writer(tmp_path, FakeClock())
    first.event("cancel", run_id="r1")
    first.close()
    second = writer(tmp_path, FakeClock())
    second.event("cancel", run_id="r2")
    second.close()
    assert first.path != second.path
    texts = sorted(path.read_text() for path in tmp_path.glob("*.jsonl"))
    assert len(texts) == 2
    assert any('"r1"' in text for text in texts)
    assert any('"r2"' in text for text in texts)


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


def test_each_event_is_in_the_file_before_the_next_is_written(tmp_path: Path) -> None:
    clock = FakeClock()
    w = writer(tmp_path, clock)
    w.event("submit", run={"id": "r0", "provider": "demo"})
    assert w.path is not None
    # Still open: what a crash now would leave on disk.
    on_disk = w.path.read_bytes().decode("utf-8").splitlines()
    assert json.loads(on_disk[-1])["run"] == {"id": "r0", "provider": "demo"}
    w.event("cancel", run_id="r0")
    assert w.path.read_bytes().decode("utf-8").splitlines()[2:] == [
        '{"t":0.0,"seq":1,"event":"cancel","run_id":"r0"}'
    ]
    w.close()


class ShortWrites(io.FileIO):
    """A file whose every write takes at most 5 bytes, as a write system call may."""

    def write(self, data: ReadableBuffer) -> int:
        return super().write(bytes(memoryview(data))[:5])


def test_a_short_write_is_completed_and_lines_count_bytes_not_characters(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lines"
    lines = FileLines(ShortWrites(path, "x"))
    written = lines.write('{"id":"é"}\n') + lines.write("{}\n")
    lines.close()
    assert path.read_bytes() == '{"id":"é"}\n{}\n'.encode()
    assert written == len('{"id":"é"}\n{}\n'.encode())


class CountingSink(io.StringIO):
    """A sink of its own kind: it sees each line as written, and each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_a_sink_of_its_own_kind_is_written_and_flushed_per_line_as_a_stringio_is_filled(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    plain, own = io.StringIO(), CountingSink()
    writers = [
        TraceWriter(tmp_path, max_bytes=1 << 62, config={}, clock=clock, wall=lambda: WALL, sink=s)
        for s in (plain, own)
    ]
    for n in range(3):
        clock.now += 0.5
        for w in writers:
            w.event("submit", run={"id": f"r{n}", "provider": "demo", "prompt": "é"})
            w.event("start", run_id=f"r{n}", account=None)
    assert own.getvalue() == plain.getvalue()
    assert own.writes == plain.getvalue().splitlines(keepends=True)
    assert own.flushes == len(own.writes) == 7
