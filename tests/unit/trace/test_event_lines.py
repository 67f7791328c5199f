"""An event's line is byte for byte what the trace's JSON encoder writes for it."""

from __future__ import annotations

import datetime as dt
import enum
import io
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herdsman.trace import TraceWriter, _dumps, event_line


class Color(enum.StrEnum):
    RED = "red"


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities too: refused alike
    | st.text()
    | st.just(Color.RED)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        | st.dictionaries(st.integers() | st.none() | st.booleans(), inner, max_size=2)
    ),
    max_leaves=8,
)
field_names = st.text(max_size=6) | st.sampled_from(["t", "seq", "event", "run_id", "run"])


def reference(t: Any, seq: int, kind: str, fields: dict[str, Any]) -> str:
    record: dict[str, Any] = {"t": t, "seq": seq, "event": kind}
    record.update(fields)
    return _dumps(record)


@given(
    st.floats() | st.integers(),
    st.integers(min_value=0),
    st.text(max_size=8),
    st.dictionaries(field_names, values, max_size=4),
)
def test_a_line_is_what_the_encoder_writes_or_refuses(
    t: Any, seq: int, kind: str, fields: dict[str, Any]
) -> None:
    try:
        expected = reference(t, seq, kind, fields)
    except ValueError as exc:
        with pytest.raises(ValueError, match=re.escape(str(exc))):
            event_line(t, seq, kind, fields)
        return
    assert event_line(t, seq, kind, fields) == expected


def test_the_usual_events_are_written_as_before() -> None:
    run = {"id": "r1", "provider": "claude", "conversation": "c/ü\n", "workspace": "default"}
    assert event_line(1.5, 0, "submit", {"run": run}) == (
        '{"t":1.5,"seq":0,"event":"submit","run":{"id":"r1","provider":"claude",'
        '"conversation":"c/ü\\n","workspace":"default"}}'
    )
    assert event_line(0.0, 7, "finish", {"run_id": "r1", "outcome": "failed", "exit_code": -9}) == (
        '{"t":0.0,"seq":7,"event":"finish","run_id":"r1","outcome":"failed","exit_code":-9}'
    )
    assert event_line(2.25, 8, "start", {"run_id": "r1", "account": None}) == (
        '{"t":2.25,"seq":8,"event":"start","run_id":"r1","account":null}'
    )


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# Times as traces have them (seconds to the microsecond, and a hair either
# side of a rounding step), the edges of the writer's shortcut, and any float.
elapsed_times = (
    st.floats(min_value=0, max_value=2e9)
    | st.floats(min_value=0.5e-4, max_value=2e-4)
    | st.floats(min_value=0.999e9, max_value=1.001e9)
    | st.floats(min_value=1e9, max_value=1e17)
    | st.builds(
        lambda micros, nudge: micros / 1e6 + nudge,
        st.integers(min_value=0, max_value=10**22),
        st.sampled_from([0.0, 5e-7, -5e-7, 1e-12, -1e-12]),
    )
    | st.sampled_from([1e-4, 0.00015, 1e9, 999999999.9999995, 0.0])
    | st.floats(allow_nan=False, allow_infinity=False)
)


@settings(max_examples=500)
@given(elapsed_times)
def test_a_writers_time_is_the_rounded_seconds_as_repr_writes_them(elapsed: float) -> None:
    # As the writer reckons it: 0.0 + -0.0 is 0.0, any other float itself.
    elapsed = 0.0 + elapsed - 0.0
    assert _line_at(Clock(), elapsed) == reference(
        round(elapsed, 6), 0, "start", {"run_id": "r1", "account": None}
    )


def test_a_clock_in_whole_numbers_gives_whole_numbers() -> None:
    assert _line_at(Clock(0), 5).startswith('{"t":5,"seq":0,')
    assert _line_at(Clock(0), 5.0).startswith('{"t":5.0,"seq":0,')


def _line_at(clock: Clock, elapsed: float) -> str:
    """The line of an event ``elapsed`` after ``clock``'s time when its writer opened."""
    sink = io.StringIO()
    writer = TraceWriter(
        Path("/unused"),
        max_bytes=1 << 62,
        config={},
        clock=clock,
        wall=lambda: dt.datetime(2026, 11, 30, tzinfo=dt.UTC),
        sink=sink,
    )
    writer.open()
    clock.now += elapsed
    writer.record("start", {"run_id": "r1", "account": None})
    return sink.getvalue().splitlines()[-1]


@given(
    st.lists(
        st.sampled_from([0.0, 1e-5, 1e-4, 1.5, 1.5000004, 1.5000006, 2.0, 1e9]) | elapsed_times
    )
)
def test_lines_in_a_row_each_write_their_own_time(times: list[float]) -> None:
    # In a row, some at the instant of the line before (the writer keeps
    # that one's text), some a hair apart.
    clock = Clock()
    sink = io.StringIO()
    writer = TraceWriter(
        Path("/unused"),
        max_bytes=1 << 62,
        config={},
        clock=clock,
        wall=lambda: dt.datetime(2026, 11, 30, tzinfo=dt.UTC),
        sink=sink,
    )
    writer.open()
    for elapsed in times:
        clock.now = 0.0 + elapsed
        writer.record("cancel", {"run_id": "r1"})
    lines = sink.getvalue().splitlines()[1:]
    assert lines == [
        reference(round(0.0 + elapsed, 6), seq, "cancel", {"run_id": "r1"})
        for seq, elapsed in enumerate(times)
    ]
