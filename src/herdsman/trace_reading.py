"""Reading a decision trace: its header and events, each line checked against the schema.

Errors name the file, the line and what was wrong (docs/trace-format.md is
the contract, :mod:`herdsman.trace_schema` its fields). :mod:`herdsman.trace`
re-exports what is read here, its writer's counterpart.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import attrs

from herdsman.trace_schema import EVENT_FIELDS, OUTCOMES, RUN_FIELDS, TRACE_VERSION

__all__ = [
    "TraceEvent",
    "TraceFormatError",
    "TraceHeader",
    "header_time",
    "read_trace",
    "read_trace_text",
]


class TraceFormatError(Exception):
    """A trace line that does not follow docs/trace-format.md."""


@attrs.frozen
class TraceEvent:
    """One event line: its time, sequence number, kind and the other fields."""

    t: float
    seq: int
    event: str
    fields: Mapping[str, Any]
    line: int


@attrs.frozen
class TraceHeader:
    """The first line of a trace file."""

    version: int
    started_at: str
    config: Mapping[str, Any]
    carry: Mapping[str, Any] | None
    #: How ``herdsman sim generate`` drew a synthetic trace (seed and model).
    generator: Mapping[str, Any] | None = None
    #: A fuzz case (``herdsman sim fuzz``): its scenario, faults included.
    fuzz: Mapping[str, Any] | None = None


def read_trace(path: Path) -> tuple[TraceHeader, Iterator[TraceEvent]]:
    """Read and validate a trace file.

    The header is read at once; events are validated lazily as they are
    iterated. Errors name the file, the line and what was wrong.
    """
    lines = _numbered_lines(path)
    try:
        number, first = next(lines)
    except StopIteration:
        raise TraceFormatError(f"{path}: empty file, expected a trace header") from None
    header = _parse_header(path, number, first)
    return header, _events(path, lines)


def read_trace_text(text: str, name: str) -> tuple[TraceHeader, Iterator[TraceEvent]]:
    """:func:`read_trace` for a trace held in memory; ``name`` stands for the file."""
    # Split as a file read in text mode is (lines end at \n, \r or \r\n only):
    # str.splitlines() would also break a line at a U+2028 in a prompt.
    lines = (
        (n, line) for n, line in enumerate(io.StringIO(text, newline=None), start=1) if line.strip()
    )
    path = Path(name)
    try:
        number, first = next(lines)
    except StopIteration:
        raise TraceFormatError(f"{name}: empty, expected a trace header") from None
    return _parse_header(path, number, first), _events(path, lines)


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read trace: {exc.strerror}") from None
    with handle:
        for number, text in enumerate(handle, start=1):
            if text.strip():
                yield number, text


def _load(path: Path, number: int, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{path}:{number}: not JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise TraceFormatError(f"{path}:{number}: expected a JSON object")
    return value


def _parse_header(path: Path, number: int, text: str) -> TraceHeader:
    obj = _load(path, number, text)
    version = obj.get("herdsman_trace")
    if version != TRACE_VERSION:
        raise TraceFormatError(
            f"{path}:{number}: herdsman_trace: "
            f"expected trace format {TRACE_VERSION}, got {version!r}"
        )
    started = obj.get("started_at")
    config = obj.get("config")
    carry = obj.get("carry")
    if not isinstance(started, str) or _parse_time(started) is None:
        raise TraceFormatError(
            f"{path}:{number}: started_at: expected an ISO-8601 time with a zone"
            f' (e.g. "2026-11-29T12:00:00.000000Z"), got {started!r}'
        )
    if not isinstance(config, dict):
        raise TraceFormatError(f"{path}:{number}: config: expected an object")
    if carry is not None:
        _check_carry(f"{path}:{number}", carry)
    generator = obj.get("generator")
    if generator is not None and not isinstance(generator, dict):
        raise TraceFormatError(f"{path}:{number}: generator: expected an object")
    fuzz = obj.get("fuzz")
    if fuzz is not None and not isinstance(fuzz, dict):
        raise TraceFormatError(f"{path}:{number}: fuzz: expected an object")
    return TraceHeader(version, started, config, carry, generator, fuzz)


def _check_carry(where: str, carry: Any) -> None:
    """``{"running": [{"run": {...}, "account": str | null}], "queued": [{...}],
    "rests": [{"provider": str, "account": str | null, "until": unix seconds}]}``."""
    if not isinstance(carry, dict):
        raise TraceFormatError(f"{where}: carry: expected an object")
    unknown = carry.keys() - {"running", "queued", "rests"}
    if unknown:
        raise TraceFormatError(
            f"{where}: carry: unknown field {sorted(unknown)[0]!r}"
            " (expected running, queued, rests)"
        )
    for key in ("running", "queued", "rests"):
        if not isinstance(carry.get(key, []), list):
            raise TraceFormatError(f"{where}: carry.{key}: expected a list")
    for n, held in enumerate(carry.get("running", [])):
        if not isinstance(held, dict) or "run" not in held:
            raise TraceFormatError(f"{where}: carry.running[{n}]: expected {{run, account}}")
        _check_run(where, held["run"], f"carry.running[{n}].run")
        account = held.get("account")
        if account is not None and not isinstance(account, str):
            raise TraceFormatError(
                f"{where}: carry.running[{n}].account: expected a string or null, got {account!r}"
            )
    for n, run in enumerate(carry.get("queued", [])):
        _check_run(where, run, f"carry.queued[{n}]")
    for n, rest in enumerate(carry.get("rests", [])):
        name = f"carry.rests[{n}]"
        if not isinstance(rest, dict):
            raise TraceFormatError(f"{where}: {name}: expected {{provider, account, until}}")
        if not isinstance(rest.get("provider"), str) or not rest["provider"]:
            raise TraceFormatError(f"{where}: {name}.provider: expected a non-empty string")
        if rest.get("account") is not None and not isinstance(rest["account"], str):
            raise TraceFormatError(f"{where}: {name}.account: expected a string or null")
        if not _seconds(rest.get("until")):
            raise TraceFormatError(
                f"{where}: {name}.until: expected unix seconds, got {rest.get('until')!r}"
            )


def _events(path: Path, lines: Iterator[tuple[int, str]]) -> Iterator[TraceEvent]:
    last_t = 0.0
    for number, text in lines:
        obj = _load(path, number, text)
        where = f"{path}:{number}"
        t, seq, kind = obj.pop("t", None), obj.pop("seq", None), obj.pop("event", None)
        if not _seconds(t):
            raise TraceFormatError(f"{where}: t: expected seconds >= 0, got {t!r}")
        if t < last_t:
            raise TraceFormatError(f"{where}: t: went backwards from {last_t} to {t}")
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise TraceFormatError(f"{where}: seq: expected a whole number, got {seq!r}")
        if kind not in EVENT_FIELDS:
            known = ", ".join(sorted(EVENT_FIELDS))
            raise TraceFormatError(f"{where}: event: expected one of {known}, got {kind!r}")
        missing = EVENT_FIELDS[kind] - obj.keys()
        if missing:
            raise TraceFormatError(f"{where}: {kind}: missing {', '.join(sorted(missing))}")
        run = obj.get("run")
        if run is not None:
            _check_run(where, run)
        _check_fields(where, kind, obj)
        if kind == "finish" and "ended" in obj:
            _check_reading(where, obj["ended"], t, "ended")
        elif kind == "start" and "decided" in obj:
            _check_reading(where, obj["decided"], t, "decided")
        last_t = float(t)
        yield TraceEvent(float(t), seq, kind, obj, number)


def _check_reading(where: str, reading: Any, t: float, key: str) -> None:
    """A finish's ``ended`` (when its end was read) or a start's ``decided`` (when the
    dispatcher decided it): in the trace's time, no later than the line."""
    if not _seconds(reading) or reading > t:
        raise TraceFormatError(
            f"{where}: {key}: expected seconds >= 0, no later than the line's t ({t}),"
            f" got {reading!r}"
        )


def _seconds(value: Any) -> bool:
    """A finite, non-negative number of seconds (JSON's 1e999 is infinite)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _parse_time(text: str) -> dt.datetime | None:
    """An ISO-8601 time that names its zone (a naive one would depend on TZ)."""
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def header_time(header: TraceHeader) -> float:
    """The header's ``started_at`` in unix seconds (validated when read)."""
    when = _parse_time(header.started_at)
    assert when is not None
    return when.timestamp()


#: Events naming a run by its id.
_RUN_ID_EVENTS = frozenset(
    {
        "start",
        "finish",
        "cancel",
        "lost",
        "usage_limit",
        "removal_wait",
        "needs_login",
        "fleet_cancel",
        "claim_refused",
        "retry",
    }
)


def _check_fields(where: str, kind: str, obj: dict[str, Any]) -> None:
    """The values a replay reads, beyond their presence."""
    if kind == "finish" and obj["outcome"] not in OUTCOMES:
        raise TraceFormatError(
            f"{where}: outcome: expected one of {', '.join(OUTCOMES)}, got {obj['outcome']!r}"
        )
    if kind == "usage_limit" and not _seconds(obj["until"]):
        raise TraceFormatError(f"{where}: until: expected unix seconds, got {obj['until']!r}")
    if kind == "submit" and "duration" in obj and not _seconds(obj["duration"]):
        raise TraceFormatError(f"{where}: duration: expected seconds >= 0, got {obj['duration']!r}")
    if kind == "rest_ended" and not (
        isinstance(obj["provider"], str)
        and (obj["account"] is None or isinstance(obj["account"], str))
    ):
        raise TraceFormatError(
            f"{where}: rest_ended: expected a provider name and an account name or null"
        )
    if kind in _RUN_ID_EVENTS and not isinstance(obj["run_id"], str):
        raise TraceFormatError(f"{where}: run_id: expected a string, got {obj['run_id']!r}")
    if kind == "reload" and not isinstance(obj["config"], dict):
        raise TraceFormatError(f"{where}: config: expected an object")
    if kind == "claim_refused" and obj["refusal"] not in ("gone", "lane", "cap"):
        raise TraceFormatError(
            f"{where}: refusal: expected one of gone, lane, cap, got {obj['refusal']!r}"
        )
    if kind == "poll":
        for key in ("runs", "left", "cancels"):
            ids = obj[key]
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise TraceFormatError(f"{where}: {key}: expected a list of run ids, got {ids!r}")


def _check_run(where: str, run: Any, name: str = "run") -> None:
    if not isinstance(run, dict):
        raise TraceFormatError(f"{where}: {name}: expected an object")
    unknown = run.keys() - RUN_FIELDS
    if unknown:
        raise TraceFormatError(f"{where}: {name}: unknown field {sorted(unknown)[0]!r}")
    for key in ("id", "provider"):
        if not isinstance(run.get(key), str) or not run[key]:
            raise TraceFormatError(f"{where}: {name}.{key}: expected a non-empty string")
    for key in ("conversation", "agent", "workspace", "cwd", "prompt"):
        if key in run and run[key] is not None and not isinstance(run[key], str):
            raise TraceFormatError(f"{where}: {name}.{key}: expected a string or null")
    cwd = run.get("cwd")
    if cwd is not None and not PurePosixPath(cwd).is_absolute():
        # The supervisor records a run's directory resolved: a relative one
        # would mean another directory wherever the trace is replayed.
        raise TraceFormatError(f"{where}: {name}.cwd: expected an absolute path, got {cwd!r}")
