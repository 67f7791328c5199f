"""Duration strings."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.config import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("14d", timedelta(days=14)),
        ("1d2h3m4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("120m", timedelta(hours=2)),
    ],
)
def test_parses_valid_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", ["", "15", "1.5h", "15 m", " 15m", "15M", "1m1h", "1h1h", "-5m", "15min", "h", "1w"]
)
def test_rejects_malformed_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (timedelta(0), "0"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(hours=2), "2h"),
        (timedelta(days=1, seconds=1), "1d1s"),
    ],
)
def test_formats_canonically(value: timedelta, expected: str) -> None:
    assert format_duration(value) == expected


@pytest.mark.parametrize("value", [timedelta(seconds=-1), timedelta(milliseconds=1)])
def test_refuses_to_format_what_the_grammar_cannot_express(value: timedelta) -> None:
    with pytest.raises(ValueError, match="cannot express"):
        format_duration(value)


@given(st.integers(min_value=0, max_value=10**9))
def test_format_then_parse_round_trips(seconds: int) -> None:
    value = timedelta(seconds=seconds)
    assert parse_duration(format_duration(value)) == value


_parts = st.tuples(*[st.one_of(st.none(), st.integers(0, 10_000)) for _ in range(4)]).filter(
    lambda parts: any(part is not None for part in parts)
)


@given(_parts)
def test_any_string_of_the_grammar_parses_to_its_sum(parts: tuple[int | None, ...]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in zip(parts, "dhms", strict=True) if n is not None)
    factors = (86_400, 3_600, 60, 1)
    expected = sum((n or 0) * factor for n, factor in zip(parts, factors, strict=True))
    value = parse_duration(text)
    assert value == timedelta(seconds=expected)
    assert parse_duration(format_duration(value)) == value
