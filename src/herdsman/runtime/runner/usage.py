"""Reading "you are out of quota" messages: is it one, and when does it reset?

The providers say when the quota comes back in free text, in several shapes
seen in the wild (quoted in the tests):

* Claude Code: ``You've hit your limit · resets 8pm (Europe/Berlin)``,
  ``… resets Apr 23 at 4pm (America/Recife)``, ``… resets 6:20pm (…)``, and the
  older ``Claude AI usage limit reached|1762952400`` (unix seconds after the bar);
* Codex: ``You've hit your usage limit. … try again in 5 days 22 hours 11
  minutes.``, ``… Please try again at Apr 11th, 2026 2:32 PM.``, ``… try again
  at 2:32 PM.`` (local time), and error bodies carrying ``"resets_at": <unix>``
  or ``"resets_in_seconds": <n>``.

Every parser takes ``now`` (unix seconds) so results never depend on the wall
clock; a shape it cannot read gives ``None`` rather than a guess.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, tzinfo
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

CLAUDE_LIMIT_RE: Final = re.compile(
    "you(?:'|\u2019)ve hit your (?:usage )?limit|usage limit reached", re.IGNORECASE
)
"""A Claude Code result text that reports an exhausted subscription limit."""

CODEX_LIMIT_RE: Final = re.compile(r"usage limit|usage_limit_reached", re.IGNORECASE)
"""A Codex error message that reports an exhausted usage limit."""

_MONTHS: Final = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}

_EPOCH_AFTER_BAR: Final = re.compile(r"\|\s*(\d{9,11})\b")
_CLAUDE_RESETS: Final = re.compile(
    r"resets\s+(?:(?P<month>[A-Za-z]{3})[a-z]*\s+(?P<day>\d{1,2})(?:,?\s+(?P<year>\d{4}))?"
    r"(?:,?\s+at)?\s+)?(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>am|pm)"
    r"(?:\s*\((?P<zone>[^)]+)\))?",
    re.IGNORECASE,
)
_RESETS_AT_FIELD: Final = re.compile(r"\"?resets_at\"?\s*[:=]\s*(\d{9,11})")
_RESETS_IN_FIELD: Final = re.compile(r"\"?resets_in_seconds\"?\s*[:=]\s*(\d+)")
_TRY_AGAIN_IN: Final = re.compile(
    r"try again in\s+((?:\d+\s*(?:days?|hours?|minutes?|mins?|seconds?|secs?)[\s,]*(?:and\s+)?)+)",
    re.IGNORECASE,
)
_DURATION_PART: Final = re.compile(r"(\d+)\s*(day|hour|min|sec)", re.IGNORECASE)
_UNIT_SECONDS: Final = {"day": 86400, "hour": 3600, "min": 60, "sec": 1}
_TRY_AGAIN_AT_DATE: Final = re.compile(
    r"try again at\s+(?P<month>[A-Za-z]{3})[a-z]*\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+"
    r"(?P<year>\d{4}),?\s+(?P<hour>\d{1,2}):(?P<minute>\d{2})\s*(?P<ampm>[AP]M)",
    re.IGNORECASE,
)
_TRY_AGAIN_AT_TIME: Final = re.compile(
    r"try again at\s+(?P<hour>\d{1,2}):(?P<minute>\d{2})\s*(?P<ampm>[AP]M)", re.IGNORECASE
)


def _hour24(hour: int, ampm: str) -> int | None:
    if not 1 <= hour <= 12:
        return None
    return hour % 12 + (12 if ampm.lower() == "pm" else 0)


def _next_time_of_day(now: float, zone: tzinfo | None, hour: int, minute: int) -> float:
    """The first instant at ``hour:minute`` in ``zone`` strictly after ``now``.

    ``zone=None`` means local time: naive datetimes follow the local rules,
    daylight saving included.
    """
    today = datetime.fromtimestamp(now, zone)
    candidate = today.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if candidate.timestamp() <= now:
        candidate = (candidate + timedelta(days=1)).replace(hour=hour, minute=minute)
    return candidate.timestamp()


def _on_date(
    now: float,
    zone: tzinfo | None,
    *,
    month: int,
    day: int,
    year: int | None,
    hour: int,
    minute: int,
) -> float | None:
    current = datetime.fromtimestamp(now, zone)
    try:
        when = datetime(year or current.year, month, day, hour, minute, tzinfo=zone)
        # Without a year, a date more than a day behind means next year's.
        if year is None and when.timestamp() < now - 86400:
            when = when.replace(year=current.year + 1)
    except ValueError:  # Feb 30 and friends
        return None
    return when.timestamp()


def parse_claude_reset(text: str, now: float) -> float | None:
    """When a Claude Code limit message says the limit resets, in unix seconds."""
    epoch = _EPOCH_AFTER_BAR.search(text)
    if epoch is not None:
        return float(epoch.group(1))
    found = _CLAUDE_RESETS.search(text)
    if found is None:
        return None
    hour = _hour24(int(found["hour"]), found["ampm"])
    minute = int(found["minute"] or 0)
    if hour is None or minute > 59:
        return None
    zone: tzinfo | None = None
    if found["zone"]:
        try:
            zone = ZoneInfo(found["zone"].strip())
        except (ZoneInfoNotFoundError, ValueError):
            return None
    if found["month"]:
        month = _MONTHS.get(found["month"][:3].lower())
        if month is None:
            return None
        year = int(found["year"]) if found["year"] else None
        return _on_date(
            now, zone, month=month, day=int(found["day"]), year=year, hour=hour, minute=minute
        )
    return _next_time_of_day(now, zone, hour, minute)


def parse_codex_reset(text: str, now: float) -> float | None:
    """When a Codex usage-limit message says the limit resets, in unix seconds.

    Codex prints absolute times in the local time zone of the machine it runs
    on, which is this one.
    """
    field = _RESETS_AT_FIELD.search(text)
    if field is not None:
        return float(field.group(1))
    field = _RESETS_IN_FIELD.search(text)
    if field is not None:
        return now + float(field.group(1))
    relative = _TRY_AGAIN_IN.search(text)
    if relative is not None:
        seconds = sum(
            int(amount) * _UNIT_SECONDS[unit.lower()]
            for amount, unit in _DURATION_PART.findall(relative.group(1))
        )
        return now + seconds
    zone = None  # local time
    dated = _TRY_AGAIN_AT_DATE.search(text)
    if dated is not None:
        month = _MONTHS.get(dated["month"][:3].lower())
        hour = _hour24(int(dated["hour"]), dated["ampm"])
        if month is None or hour is None or int(dated["minute"]) > 59:
            return None
        return _on_date(
            now,
            zone,
            month=month,
            day=int(dated["day"]),
            year=int(dated["year"]),
            hour=hour,
            minute=int(dated["minute"]),
        )
    timed = _TRY_AGAIN_AT_TIME.search(text)
    if timed is not None:
        hour = _hour24(int(timed["hour"]), timed["ampm"])
        if hour is None or int(timed["minute"]) > 59:
            return None
        return _next_time_of_day(now, zone, hour, int(timed["minute"]))
    return None
