"""The decision trace: one JSON line per scheduling event, the simulator's input.

The format is a public, versioned contract (docs/trace-format.md). A trace
file starts with a header line::

    {"herdsman_trace": 1, "started_at": "2026-11-29T12:00:00.000000Z", "config": {...}}

followed by one event per line, ``{"t": 1.25, "seq": 0, "event": "submit", ...}``,
where ``t`` is seconds since the header and ``seq`` counts events in the file.
When a file reaches ``max_bytes`` it ends with a ``rotated`` event naming
the next file, and the writer starts that one, whose header
also carries the runs still queued or running (``"carry"``: ``{"running":
[{"run": {...}, "account": ...}], "queued": [{...}]}``, each in submission
order, and ``"rests"``: the accounts still resting), so every file can be
replayed on its own.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring as _encode_string
from pathlib import Path
from typing import IO, Any

from herdsman.runtime.state_paths import PRIVATE_DIR, private_opener
from herdsman.trace_reading import (
    TraceEvent,
    TraceFormatError,
    TraceHeader,
    header_time,
    read_trace,
    read_trace_text,
)
from herdsman.trace_schema import EVENT_FIELDS, OUTCOMES, RUN_FIELDS, TRACE_VERSION

# The reader and the schema are re-exported: the trace's readers import them from here.
__all__ = [
    "EVENT_FIELDS",
    "OUTCOMES",
    "RUN_FIELDS",
    "TRACE_VERSION",
    "TraceEvent",
    "TraceFormatError",
    "TraceHeader",
    "TraceWriter",
    "event_line",
    "format_time",
    "header_time",
    "read_trace",
    "read_trace_text",
]

log = logging.getLogger("herdsman.trace")


#: Each event kind's ``"event"`` member as its line writes it.
_EVENT_HEADS = {kind: '"event":' + json.dumps(kind) for kind in EVENT_FIELDS}


# Insertion order, no spaces: the same events always give the same bytes. One
# encoder for every line: json.dumps with options builds a new one per call,
# which doubled the cost of a line.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dumps(obj: Mapping[str, Any]) -> str:
    return _ENCODER.encode(obj)


_HEAD_KEYS = frozenset({"t", "seq", "event"})

# An event's ``t`` is ``float.__repr__(round(elapsed, 6))``: two conversions
# of a float to decimal digits, about 3,000 and 5,500 instructions. In this
# range ``f"{elapsed:.6f}"`` alone writes the same text, less trailing zeros:
# it makes the very conversion ``round`` makes (correctly rounded to six
# places, half to even on the exact binary value), and digits that few (at
# most 15 significant ones) are the shortest that give ``round``'s float
# back, which is what ``repr`` writes, positionally from 1e-4 up (below, it
# writes ``1e-05``). Outside it, the two calls.
_TIME_LOW, _TIME_HIGH = 1e-4, 1e9
_KEYS: dict[str, str] = {}  # a field name -> a comma, its JSON text and a colon
_MAX_KEYS = 256


def _value(value: Any) -> str:
    """``value`` as ``_ENCODER`` writes it inside an object."""
    kind = type(value)
    # Exact types only: bool is an int, an enum member a str; the encoder
    # writes those its own way, so they take its path.
    if kind is str:
        return _encode_string(value)
    if value is None:
        return "null"
    if kind is int:
        return int.__repr__(value)
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    if kind is dict and value:
        members = _members(value)
        if members is not None:
            return "{" + members[1:] + "}"
    return _ENCODER.encode(value)  # lists, bools, odd keys; NaN raises as before


def _members(fields: Mapping[Any, Any]) -> str | None:
    """``,"key":value`` for each item, as ``_ENCODER`` writes them; None if a key is no str."""
    parts = []
    for key, value in fields.items():
        name = _KEYS.get(key)
        if name is None:
            if type(key) is not str:  # the encoder turns 1 into "1": its path
                return None
            name = "," + _encode_string(key) + ":"
            if len(_KEYS) < _MAX_KEYS:  # field names come from code: a few dozen
                _KEYS[key] = name
        parts.append(name)
        # Most values are strings: written here without a call to _value.
        parts.append(_encode_string(value) if type(value) is str else _value(value))
    return "".join(parts)


def event_line(t: float, seq: int, kind: str, fields: Mapping[str, Any]) -> str:
    """The JSON line of an event: ``_dumps({"t": t, "seq": seq, "event": kind, **fields})``.

    Byte for byte the same, at about half the cost for the usual event (a
    few strings and numbers, a run object): JSON is compositional, so each
    value is written on its own, the plain ones without the encoder's
    machinery.

    Why composed by hand rather than by ``json``: the simulator writes three
    lines a run, and with every line through the encoder (this function
    as its first line, ``record`` without its shortcut, no ``submit``,
    ``start`` and ``finish`` from values, ``trace_run_text`` gone) a replay
    cost 81,400 instructions a run more, 733,555 against 652,146
    (``benchmarks/sim_replay.py --cachegrind --replay-pass``): about 12%,
    which would take the replay to the edge of its floor of 75% of a bare
    trio loop's rate (docs/simulator.md, "Production without simulator
    special cases"). Hypothesis tests (tests/unit/trace) hold it to the
    encoder's bytes.
    """
    members = None
    if type(t) is float and math.isfinite(t) and _HEAD_KEYS.isdisjoint(fields):
        members = _members(fields)
    if members is None:
        return _dumps({"t": t, "seq": seq, "event": kind, **fields})
    return f'{{"t":{float.__repr__(t)},"seq":{seq:d},"event":{_encode_string(kind)}{members}}}'


class _FileLines:
    """A trace file opened unbuffered: each line is one ``write`` system call.

    What a text file's ``write`` and ``flush`` did per line, without the text
    layer: the line is encoded once (its length in bytes, for rotation, comes
    with it) and goes to the OS at once (docs/performance.md).
    """

    __slots__ = ("_raw",)

    def __init__(self, raw: io.FileIO) -> None:
        self._raw = raw

    def write(self, line: str) -> int:
        """Write ``line`` (its newline included) in full; the bytes written."""
        data = line.encode("utf-8")
        written = self._raw.write(data)
        if written != len(data):  # a write may take less than all (a nearly full disk)
            with memoryview(data) as view:
                while written < len(data):
                    written += self._raw.write(view[written:])
        return len(data)

    def close(self) -> None:
        """Close the file."""
        self._raw.close()


class _SinkLines:
    """A caller's text stream: written and flushed per line."""

    __slots__ = ("_sink",)

    def __init__(self, sink: IO[str]) -> None:
        self._sink = sink

    def write(self, line: str) -> int:
        """Write ``line`` (its newline included); the bytes it takes in UTF-8."""
        self._sink.write(line)
        self._sink.flush()
        return len(line) if line.isascii() else len(line.encode("utf-8"))

    def close(self) -> None:
        """Nothing: the sink is the caller's to close."""


class _BufferLines:
    """An ``io.StringIO`` itself (the simulator's buffer), written by its own ``write``.

    No Python frame per line: nothing to flush, and the size it counts (in
    characters, not bytes) is never used, as a sink is never rotated.
    """

    __slots__ = ("write",)

    def __init__(self, sink: io.StringIO) -> None:
        self.write: Callable[[str], int] = sink.write

    def close(self) -> None:
        """Nothing: the sink is the caller's to close."""


def _read_before(read: float, elapsed: float) -> float | None:
    """A reading ``read`` seconds into the file, as a line written ``elapsed`` in says it.

    None unless it comes before the line's time and after the file's
    opening, to the microsecond: read and traced at once, or read before a
    file opened since (a rotation), the line's own time stands for it.
    """
    read = round(read, 6)
    return read if 0 < read < round(elapsed, 6) else None


def format_time(when: dt.datetime) -> str:
    """ISO-8601 in UTC with microseconds and a ``Z``, as headers carry it."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class TraceWriter:
    """Appends events to JSON Lines files in ``directory``, rotating at ``max_bytes``.

    Each event is flushed to the OS as it is written, so a crash loses at most
    the event being written. ``clock`` is a monotonic seconds clock (the trio
    clock in the supervisor, the fake clock in the simulator); ``wall`` gives
    the header's ``started_at``. The writer follows the runs its events
    describe, to restate those queued or running in the header of a rotated
    file (``carry``): as the events written so far tell it, never ahead of
    them. With a ``sink`` (the simulator's in-memory
    buffer) everything goes there, in one file's worth, never rotated.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int,
        config: Mapping[str, Any],
        clock: Callable[[], float],
        wall: Callable[[], dt.datetime],
        sink: IO[str] | None = None,
    ) -> None:
        self._directory = directory
        self._sink = sink
        self._max_bytes = max_bytes
        self._config: Mapping[str, Any] = config
        self._clock = clock
        #: A reading of the trace's clock: a moment a later line names (a
        #: finish's ``ended``). The clock itself, called at no extra cost.
        self.now: Callable[[], float] = clock
        self._wall = wall
        # Runs queued or running as the events written so far tell, in
        # submission order: id -> [run object, running?, account].
        self._live: dict[str, list[Any]] = {}
        # Accounts resting as the events tell: (provider, account) -> until.
        self._rests: dict[tuple[str, str | None], float] = {}
        self._file: _FileLines | _SinkLines | _BufferLines | None = None
        self._path: Path | None = None
        self._origin = 0.0
        self._seq = 0
        self._size = 0
        self._files_opened = 0
        #: Events that could not be written (the trace stops at the first).
        self.failed = 0

    @property
    def path(self) -> Path | None:
        """The file being written, once the first event opened one."""
        return self._path

    def set_config(self, config: Mapping[str, Any]) -> None:
        """The effective config to put in the next rotated file's header."""
        self._config = config

    def open(self) -> None:
        """Open the first file now, so an unusable ``directory`` fails at start-up.

        Raises ``OSError``.
        """
        if self._file is None:
            self._open_new()

    def event(self, kind: str, **fields: Any) -> None:
        """Append one event; opens or rotates the file as needed.

        A write error (disk full, directory gone) is logged and stops the
        trace; it never stops the supervisor, whose ledger is the record of
        truth. ``failed`` counts the events lost.
        """
        self.record(kind, fields)

    def record(self, kind: str, fields: dict[str, Any]) -> None:
        """As :meth:`event`, the fields given as a dict: one copy of them less per line."""
        head = _EVENT_HEADS.get(kind)
        if head is None:
            raise ValueError(f"unknown trace event {kind!r}")
        if self.failed:
            self.failed += 1
            return
        try:
            if self._file is None or self._size >= self._max_bytes:
                self._open_new()
            assert self._file is not None
            # event_line's line through the writer's shortcut (its time with
            # one conversion), when the fields can take it.
            if "t" not in fields and "seq" not in fields and "event" not in fields:
                members = _members(fields)
                if members is not None and self._shortcut(head, members):
                    if self._sink is None and not self.failed:  # never rotated: nothing to restate
                        self._follow(kind, fields)
                    return
            elapsed = self._clock() - self._origin
            line = event_line(round(elapsed, 6), self._seq, kind, fields) + "\n"
            self._size += self._file.write(line)
            self._seq += 1
            if self._sink is None:  # a sink is never rotated: nothing to restate
                self._follow(kind, fields)
        except OSError as exc:
            self.failed += 1
            # One line, no traceback: a full disk is news, not a bug.
            log.error("the trace stops here: cannot write to %s: %s", self._directory, exc)

    # The three lines of every run, from their values: no dict of fields
    # built to be walked, each value written by its own type (about a third
    # of what record costs them). The same bytes as record's.

    def submit(self, run_id: str, run: str) -> None:
        """A submit event; ``run`` is its run object's JSON text (``trace_run_text``'s)."""
        if self._shortcut('"event":"submit","run":', run):
            if self._sink is None and not self.failed:
                self._live[run_id] = [run, False, None]  # read back only for a carry
            return
        self.record("submit", {"run": json.loads(run)})

    def start(self, run_id: str, account: str | None, decided: float | None = None) -> None:
        """A start event: ``record("start", {"run_id": run_id, "account": account})``.

        ``decided``: when the dispatcher decided it, a reading of the
        trace's clock (:attr:`now`); written (``"decided"``, in the line's
        time) when it came before the line's own time, in this file.
        """
        if (
            type(run_id) is str
            and (account is None or type(account) is str)
            and self._shortcut(
                '"event":"start","run_id":',
                _encode_string(run_id)
                + (
                    ',"account":null'
                    if account is None
                    else ',"account":' + _encode_string(account)
                ),
                decided,
                ',"decided":',
            )
        ):
            if self._sink is None and not self.failed:
                self._follow("start", {"run_id": run_id, "account": account})
            return
        fields: dict[str, Any] = {"run_id": run_id, "account": account}
        self._read_field(fields, "decided", decided)
        self.record("start", fields)

    def finish(
        self,
        run_id: str,
        outcome: str,
        exit_code: int | None,
        *,
        requeued: bool,
        spend: Mapping[str, Any] | None = None,
        failure: str | None = None,
        worked: bool = False,
        session: bool = False,
        ended: float | None = None,
    ) -> None:
        """A finish event: its run, outcome and exit code, ``"requeued": true`` if so.

        ``spend``: what the attempt spent, as JSON (``spend_json``'s); the
        event carries it only when given, so a trace of runs whose streams
        said nothing of it reads as it did before. ``failure``: a failed
        attempt's retry class, and ``worked`` (written only with it) that
        its agent may have done work: what a replay needs to decide its
        retry again. ``session``: the attempt's agent reported a session (its
        conversation sticks to the account it ran on). ``ended``: when the
        supervisor read the attempt's end, a reading of the trace's clock
        (:attr:`now`); written (``"ended"``, in the line's time) when it
        came before the line's own time, in this file.
        """
        if (
            type(run_id) is str
            and type(outcome) is str
            and (exit_code is None or type(exit_code) is int)
            and (failure is None or isinstance(failure, str))
            and self._shortcut(
                '"event":"finish","run_id":',
                f'{_encode_string(run_id)},"outcome":{_encode_string(outcome)},"exit_code":'
                f"{'null' if exit_code is None else int.__repr__(exit_code)}"
                + ("" if failure is None else ',"failure":' + _encode_string(str(failure)))
                + (',"worked":true' if worked and failure is not None else "")
                + (',"session":true' if session else "")
                + (',"requeued":true' if requeued else "")
                + ("" if spend is None else ',"spend":' + _ENCODER.encode(spend)),
                ended,
            )
        ):
            if self._sink is None and not self.failed:
                self._follow("finish", {"run_id": run_id, "requeued": requeued})
            return
        fields: dict[str, Any] = {"run_id": run_id, "outcome": outcome, "exit_code": exit_code}
        if failure is not None:
            fields["failure"] = str(failure)
            if worked:
                fields["worked"] = True
        if session:
            fields["session"] = True
        if requeued:
            fields["requeued"] = True
        if spend is not None:
            fields["spend"] = spend
        self._read_field(fields, "ended", ended)
        self.record("finish", fields)

    def _read_field(self, fields: dict[str, Any], key: str, reading: float | None) -> None:
        """Add ``reading`` (of :attr:`now`) to ``fields`` as ``key`` if before the line's time."""
        if reading is not None and self._file is not None and self._size < self._max_bytes:
            read = _read_before(reading - self._origin, self._clock() - self._origin)
            if read is not None:
                fields[key] = read

    def _shortcut(
        self, head: str, rest: str, reading: float | None = None, key: str = ',"ended":'
    ) -> bool:
        """Write ``{"t":…,"seq":…,`` ``head`` ``rest`` ``}``, the line's time with one conversion.

        False if that does not apply (nothing written: record's path then,
        for the first line, a time outside the shortcut's range, a stopped
        trace, a rotation due); True once written, or once the write failed
        (``failed`` then says so). ``reading``: a finish's reading of
        :attr:`now` (or a start's, with ``key`` ``,"decided":``), written
        last as ``key`` if before the line's time.
        """
        if self.failed or self._file is None or self._size >= self._max_bytes:
            return False
        now = self._clock()
        elapsed = now - self._origin
        # An int clock's round() is an int: "5", not "5.0" (record's path).
        if not (_TIME_LOW <= elapsed < _TIME_HIGH and type(elapsed) is float):
            return False
        # A reading at this very moment (a simulator's clock) says nothing more.
        if reading is not None and reading != now:
            read = _read_before(reading - self._origin, elapsed)
            if read is not None:
                rest += key + float.__repr__(read)
        # float.__repr__(round(elapsed, 6)) with one conversion to decimal
        # digits instead of two (see _TIME_LOW).
        t = f"{elapsed:.6f}".rstrip("0")
        if t[-1] == ".":
            t += "0"
        try:
            self._size += self._file.write(f'{{"t":{t},"seq":{self._seq},{head}{rest}}}\n')
        except OSError as exc:
            self.failed += 1
            log.error("the trace stops here: cannot write to %s: %s", self._directory, exc)
            return True
        self._seq += 1
        return True

    def _follow(self, kind: str, fields: Mapping[str, Any]) -> None:
        if kind == "submit":
            self._live[fields["run"]["id"]] = [fields["run"], False, None]
        elif kind == "start":
            held = self._live.get(fields["run_id"])
            if held is not None:
                held[1], held[2] = True, fields.get("account")
        elif kind == "finish" and fields.get("requeued"):
            held = self._live.get(fields["run_id"])
            if held is not None:
                held[1], held[2] = False, None
        elif kind in ("finish", "cancel", "lost"):
            self._live.pop(fields["run_id"], None)
        elif kind == "usage_limit":
            self._rests[(fields["provider"], fields["account"])] = fields["until"]
        elif kind == "rest_ended":
            self._rests.pop((fields["provider"], fields["account"]), None)

    def _carry(self) -> dict[str, Any]:
        # A run that submit() followed is held as its JSON text.
        running = [
            {"run": json.loads(run) if type(run) is str else run, "account": account}
            for run, on, account in self._live.values()
            if on
        ]
        queued = [
            json.loads(run) if type(run) is str else run
            for run, on, _ in self._live.values()
            if not on
        ]
        now = self._wall().timestamp()
        rests = [
            {"provider": provider, "account": account, "until": until}
            for (provider, account), until in self._rests.items()
            if until > now
        ]
        return {"running": running, "queued": queued, "rests": rests}

    def rotate(self) -> None:
        """Go on in a new file now, as reaching ``max_bytes`` does (no-op with a sink)."""
        if self._file is not None:
            self._open_new()

    def close(self) -> None:
        """Close the current file (a sink stays open: it is the caller's)."""
        if self._file is not None:
            self._file.close()
        self._file = None

    def _open_new(self) -> None:
        carry = self._carry() if self._file is not None else None
        started = self._wall()
        if self._sink is not None:
            if self._file is not None:
                return  # a sink is one file's worth: never rotated
            # Exactly a StringIO (a subclass may write or flush its own way).
            if type(self._sink) is io.StringIO:
                self._file = _BufferLines(self._sink)
            else:
                self._file = _SinkLines(self._sink)
        else:
            # Private: a trace holds every run's identity and the config.
            self._directory.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
            stamp = started.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%S")
            while True:  # never over another trace (a restart within the second)
                self._files_opened += 1
                name = f"trace-{stamp}-{os.getpid()}-{self._files_opened}.jsonl"
                path = self._directory / name
                try:
                    opened = _FileLines(io.FileIO(path, "x", opener=private_opener))
                except FileExistsError:
                    continue
                break
            if self._file is not None:
                # The old file says where it goes on: a reader (sim diff) then
                # knows that its end is not the end of the recording.
                elapsed = round(self._clock() - self._origin, 6)
                self._write(event_line(elapsed, self._seq, "rotated", {"next": name}))
            self.close()
            self._file = opened
            self._path = path
        self._origin = self._clock()
        self._seq = 0
        self._size = 0
        header: dict[str, Any] = {
            "herdsman_trace": TRACE_VERSION,
            "started_at": format_time(started),
            "config": self._config,
        }
        if carry:
            header["carry"] = carry
        self._write(_dumps(header))

    def _write(self, line: str) -> None:
        assert self._file is not None
        self._size += self._file.write(line + "\n")
