"""Duration strings: ``"90s"``, ``"15m"``, ``"1h30m"``, ``"14d"`` and ``"0"``.

The grammar is deliberately small: whole numbers followed by a unit, units in
descending order (d, h, m, s), each at most once, no spaces. ``"0"`` on its own
means zero. Anything else is rejected rather than guessed at.
"""

from __future__ import annotations

import re
from datetime import timedelta

__all__ = ["DURATION_HINT", "format_duration", "parse_duration"]

DURATION_HINT = 'a duration such as "90s", "15m", "1h30m", "14d" or "0"'

_UNITS: tuple[tuple[str, int], ...] = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
_GRAMMAR = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


#: The longest duration accepted: far beyond any sensible limit, and well
#: inside what timedelta (and trio's clock) can hold.
MAX_DAYS = 36500
MAX_SECONDS = MAX_DAYS * 86400


def parse_duration(text: str) -> timedelta:
    """Parse a duration string into a :class:`~datetime.timedelta`.

    Raises :class:`ValueError` when ``text`` does not follow the grammar.
    """
    if text == "0":
        return timedelta(0)
    match = _GRAMMAR.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"not {DURATION_HINT}: {text!r}")
    seconds = sum(
        int(amount) * factor
        for amount, (_, factor) in zip(match.groups(), _UNITS, strict=True)
        if amount is not None
    )
    if seconds > MAX_SECONDS:
        raise ValueError(f"{text!r} is longer than the longest duration, {MAX_DAYS}d")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """Render ``value`` in the canonical form :func:`parse_duration` reads back.

    Only whole, non-negative seconds are representable; anything else raises
    :class:`ValueError` because a silently rounded duration would lie.
    """
    if value < timedelta(0) or value.microseconds:
        raise ValueError(f"cannot express {value!r} as a duration string")
    remaining = int(value.total_seconds())
    if remaining == 0:
        return "0"
    parts: list[str] = []
    for unit, factor in _UNITS:
        amount, remaining = divmod(remaining, factor)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts)
