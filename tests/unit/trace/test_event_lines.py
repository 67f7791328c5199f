"""An event's line is byte for byte what the trace's JSON encoder writes for it."""

from __future__ import annotations

import enum
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.trace import _dumps, event_line


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
