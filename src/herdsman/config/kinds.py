"""Value kinds: how one setting is checked, normalised and written back as TOML.

Each field of the model (:mod:`herdsman.config.model`) names its kind in the
field metadata, so the model is the one schema: the validator, ``config get``
and the documentation tests all read it from there. A leaf kind turns a raw
TOML value into the value the model stores, or raises :class:`Invalid` with a
message saying what would be right and what was found.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from herdsman.config.durations import DURATION_HINT, MAX_DAYS, format_duration, parse_duration
from herdsman.config.render import inline_toml
from herdsman.postgres_url import EXAMPLE_URL, masked_url, parse_postgres_url

if TYPE_CHECKING:
    from herdsman.config.keypath import KeyPath
    from herdsman.config.validate import Checker

__all__ = [
    "ArrayOfTables",
    "Boolean",
    "Caps",
    "Choice",
    "Duration",
    "Invalid",
    "Kind",
    "Listen",
    "Name",
    "NamedTables",
    "PathValue",
    "PostgresUrl",
    "Regex",
    "StringList",
    "StringTable",
    "Table",
    "WholeNumber",
    "describe",
]


class Invalid(Exception):
    """A raw value does not fit its kind; the message says what was expected."""


def describe(value: object) -> str:
    """Show a raw TOML value in a message the way it would be written in TOML."""
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, datetime | date | time):
        return f"a date/time ({value.isoformat()})"
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else inline_toml(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Kind:
    """Base of all kinds. ``expected`` completes "must be ..." in messages."""

    expected: str = "a value"
    leaf: bool = True

    def check(self, raw: object, path: KeyPath, checker: Checker) -> Any:
        """Return the normalised value of ``raw`` or raise :class:`Invalid`."""
        raise NotImplementedError

    def to_toml(self, value: Any) -> Any:
        """The TOML form of a normalised value (``None`` when it has none)."""
        return value

    def fail(self, raw: object) -> Invalid:
        """The standard "must be X, got Y" error."""
        return Invalid(f"must be {self.expected}, got {describe(raw)}")


@attrs.frozen
class Boolean(Kind):
    """``true`` or ``false``."""

    expected: str = "true or false"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> bool:
        if not isinstance(raw, bool):
            raise self.fail(raw)
        return raw


@attrs.frozen
class WholeNumber(Kind):
    """An integer in ``[low, high]`` (``high`` ``None``: no upper bound); never a bool."""

    low: int = 1
    high: int | None = None

    @property
    def expected(self) -> str:  # type: ignore[override]
        if self.high is None:
            return f"a whole number of at least {self.low}"
        return f"a whole number from {self.low} to {self.high}"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> int:
        # bool is a subclass of int: `true` must not pass for 1.
        if not isinstance(raw, int) or isinstance(raw, bool):
            raise self.fail(raw)
        if raw < self.low or (self.high is not None and raw > self.high):
            raise self.fail(raw)
        return raw


@attrs.frozen
class Amount(Kind):
    """A finite number greater than zero, whole or not; never a bool."""

    expected: str = "a number greater than zero"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise self.fail(raw)
        if not math.isfinite(raw) or raw <= 0:
            raise self.fail(raw)
        return raw


@attrs.frozen
class Duration(Kind):
    """A duration string; ``positive`` rejects zero, ``zero_is_none`` stores zero as ``None``."""

    positive: bool = False
    zero_is_none: bool = False

    @property
    def expected(self) -> str:  # type: ignore[override]
        if self.positive:
            return DURATION_HINT.replace(' or "0"', "") + " (greater than zero)"
        return DURATION_HINT

    def check(self, raw: object, path: KeyPath, checker: Checker) -> timedelta | None:
        if not isinstance(raw, str):
            raise self.fail(raw)
        try:
            value = parse_duration(raw)
        except ValueError:
            if not _TOO_LONG.fullmatch(raw):
                raise self.fail(raw) from None
            raise Invalid(f"must be at most {MAX_DAYS}d, got {describe(raw)}") from None
        if not value:
            if self.positive:
                raise self.fail(raw)
            if self.zero_is_none:
                return None
        return value

    def to_toml(self, value: Any) -> Any:
        if value is None:
            return "0" if self.zero_is_none else None
        return format_duration(value)


# Well formed but longer than parse_duration takes.
_TOO_LONG = re.compile(r"(\d+[dhms])+")


@attrs.frozen
class PathValue(Kind):
    """A filesystem path; ``~`` expands, a relative path is taken from the config's folder."""

    expected: str = "a non-empty path string"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> Path:
        if not isinstance(raw, str) or not raw or "\0" in raw:
            raise self.fail(raw)
        try:
            expanded = Path(raw).expanduser()
        except RuntimeError:  # ~name of a user this machine does not know
            user = raw[1:].split("/", 1)[0]
            raise Invalid(
                f"{describe(raw)} starts with ~{user}, but there is no user {user!r} here;"
                " write the path in full"
            ) from None
        return checker.base_dir / expanded

    def to_toml(self, value: Any) -> Any:
        return None if value is None else str(value)


@attrs.frozen
class Choice(Kind):
    """One of a fixed set of strings."""

    options: tuple[str, ...] = ()

    @property
    def expected(self) -> str:  # type: ignore[override]
        quoted = [json.dumps(option) for option in self.options]
        return "one of " + ", ".join(quoted[:-1]) + f" or {quoted[-1]}"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> str:
        if raw not in self.options or not isinstance(raw, str):
            raise self.fail(raw)
        return raw


@attrs.frozen
class ChoiceList(Kind):
    """A list of distinct strings, each one of a fixed set (empty allowed)."""

    options: tuple[str, ...] = ()

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "a list of " + ", ".join(json.dumps(option) for option in self.options)

    def check(self, raw: object, path: KeyPath, checker: Checker) -> tuple[str, ...]:
        if not isinstance(raw, list):
            raise self.fail(raw)
        good = True
        seen: set[str] = set()
        for number, element in enumerate(raw):
            if not isinstance(element, str) or element not in self.options:
                quoted = [json.dumps(option) for option in self.options]
                choices = ", ".join(quoted[:-1]) + f" or {quoted[-1]}"
                checker.problem(
                    (*path, number), f"must be one of {choices}, got {describe(element)}"
                )
                good = False
            elif element in seen:
                checker.problem((*path, number), f"{describe(element)} is listed twice")
                good = False
            else:
                seen.add(element)
        if not good:
            raise Invalid("")  # already reported per element
        return tuple(raw)

    def to_toml(self, value: Any) -> Any:
        return list(value)


@attrs.frozen
class Name(Kind):
    """A string matching ``pattern`` (names of accounts and repos)."""

    pattern: str = r"[A-Za-z0-9_-]+"
    expected: str = "a name of letters, digits, '_' and '-'"
    forbidden: tuple[str, ...] = ()

    def check(self, raw: object, path: KeyPath, checker: Checker) -> str:
        if not isinstance(raw, str) or not re.fullmatch(self.pattern, raw):
            raise self.fail(raw)
        if raw in self.forbidden:
            raise Invalid(f"must not be {describe(raw)}")
        return raw


@attrs.frozen
class Regex(Kind):
    """A Python regular expression that compiles."""

    expected: str = "a regular expression (a string)"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> str:
        if not isinstance(raw, str):
            raise self.fail(raw)
        try:
            re.compile(raw)
        except re.error as error:
            raise Invalid(
                f"must be a valid regular expression, got {describe(raw)}: {error}"
            ) from None
        return raw


@attrs.frozen
class Listen(Kind):
    """``HOST:PORT``; an IPv6 host goes in brackets (``[::1]:7878``)."""

    expected: str = 'HOST:PORT with a port from 1 to 65535, e.g. "127.0.0.1:7878" or "[::1]:7878"'

    def check(self, raw: object, path: KeyPath, checker: Checker) -> str:
        if not isinstance(raw, str):
            raise self.fail(raw)
        host, colon, port = raw.rpartition(":")
        if not colon or not host or not port.isascii() or not port.isdigit():
            raise self.fail(raw)
        if not 1 <= int(port) <= 65535:
            raise self.fail(raw)
        if host.startswith("["):
            try:
                ipaddress.IPv6Address(host.removeprefix("[").removesuffix("]"))
            except ValueError:
                raise self.fail(raw) from None
            if not host.endswith("]"):
                raise self.fail(raw)
        elif ":" in host:
            raise Invalid(
                f'must put an IPv6 address in brackets, e.g. "[{host}]:{port}", got {describe(raw)}'
            )
        elif any(char.isspace() or char in "[]/" for char in host):
            raise self.fail(raw)
        return raw


@attrs.frozen
class PostgresUrl(Kind):
    """A PostgreSQL URL libpq accepts, naming a host and a database, without a password."""

    expected: str = f"a PostgreSQL URL, e.g. {json.dumps(EXAMPLE_URL)}"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> str:
        if not isinstance(raw, str):
            raise self.fail(raw)
        try:
            params = parse_postgres_url(raw)
        except ValueError as error:
            raise Invalid(str(error)) from None
        if "password" in params:
            # The file is shown by `herdsman check` and copied into every
            # trace header and reload report: no place for a secret.
            raise Invalid(
                "must not contain a password (herdsman check, traces and reload reports"
                " show this value); put it in ~/.pgpass or the PGPASSWORD environment"
                f" variable instead; got {masked_url(raw)!r}"
            )
        return raw


@attrs.frozen
class StringList(Kind):
    """A list of non-empty strings; ``non_empty`` also requires at least one."""

    non_empty: bool = True
    example: str = '["claude", "-p"]'

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"a non-empty list of strings, e.g. {self.example}"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> tuple[str, ...]:
        if not isinstance(raw, list) or (self.non_empty and not raw):
            raise self.fail(raw)
        good = True
        for number, element in enumerate(raw):
            if not isinstance(element, str) or not element:
                checker.problem(
                    (*path, number), f"must be a non-empty string, got {describe(element)}"
                )
                good = False
            elif "\0" in element:
                # argv cannot hold it; refuse it here, not at the first run.
                checker.problem((*path, number), "must not contain a NUL character")
                good = False
        if not good:
            raise Invalid("")  # already reported per element
        return tuple(raw)

    def to_toml(self, value: Any) -> Any:
        return list(value)


@attrs.frozen
class StringTable(Kind):
    """A table of string values, e.g. environment variables."""

    expected: str = 'a table of strings, e.g. { NAME = "value" }'

    def check(self, raw: object, path: KeyPath, checker: Checker) -> dict[str, str]:
        if not isinstance(raw, Mapping):
            raise self.fail(raw)
        good = True
        for key, value in raw.items():
            if not key or "=" in key or "\0" in key:
                checker.problem(
                    (*path, key), "must be an environment variable name (no '=', not empty)", "key"
                )
                good = False
            elif not isinstance(value, str):
                checker.problem((*path, key), f"must be a string, got {describe(value)}")
                good = False
            elif "\0" in value:
                # A process environment cannot hold it; refuse it here, not at the first run.
                checker.problem((*path, key), "must not contain a NUL character")
                good = False
        if not good:
            raise Invalid("")  # already reported per entry
        return dict(raw)

    def to_toml(self, value: Any) -> Any:
        return dict(value)


@attrs.frozen
class Caps(Kind):
    """A table of caps keyed by name (``{ claude = 4 }``); ``nested``: a table of those per name.

    The names are checked against the configuration by the enclosing
    table's post check; here only the shape and the numbers.
    """

    nested: bool = False

    @property
    def expected(self) -> str:  # type: ignore[override]
        if self.nested:
            return "a table of tables of whole numbers, e.g. { claude = { work = 2 } }"
        return "a table of whole numbers, e.g. { claude = 4 }"

    def check(self, raw: object, path: KeyPath, checker: Checker) -> dict[str, Any]:
        if not isinstance(raw, Mapping):
            raise self.fail(raw)
        good = True
        out: dict[str, Any] = {}
        inner = Caps()
        for key, value in raw.items():
            try:
                out[key] = (
                    inner.check(value, (*path, key), checker)
                    if self.nested
                    else _CAP.check(value, (*path, key), checker)
                )
            except Invalid as error:
                if str(error):
                    checker.problem((*path, key), str(error))
                good = False
        if not good:
            raise Invalid("")  # already reported per entry
        return out

    def to_toml(self, value: Any) -> Any:
        return {key: dict(cap) if self.nested else cap for key, cap in value.items()}


_CAP = WholeNumber(1)


PostCheck = Callable[[Mapping[str, Any], dict[str, Any], "KeyPath", "Checker"], None]


@attrs.frozen
class Table(Kind):
    """A table structured as the attrs class ``cls``; ``post`` checks across its fields."""

    cls: type = object
    post: PostCheck | None = None
    expected: str = "a table"
    leaf: bool = False

    def check(self, raw: object, path: KeyPath, checker: Checker) -> Any:
        return checker.check_table(self, raw, path)


@attrs.frozen
class NamedTables(Kind):
    """A table of tables keyed by a name matching ``pattern`` (e.g. ``[providers.NAME]``)."""

    item: Table = Table()
    pattern: str = r"[A-Za-z0-9_-]+"
    name_rule: str = "letters, digits, '_' and '-'"
    min_count: int = 0
    noun: str = "entry"
    example: str = ""
    expected: str = "a table of tables"
    leaf: bool = False

    def check(self, raw: object, path: KeyPath, checker: Checker) -> Any:
        if not isinstance(raw, Mapping):
            raise self.fail(raw)
        out: dict[str, Any] = {}
        for name, table in raw.items():
            if not re.fullmatch(self.pattern, name):
                checker.problem((*path, name), f"name must be made of {self.name_rule}", "key")
                continue
            out[name] = self.item.check(table, (*path, name), checker)
        if len(raw) < self.min_count:
            checker.problem(
                path,
                f"at least {self.min_count} {self.noun} required, e.g. {self.example}",
                "header",
            )
        return out


@attrs.frozen
class ArrayOfTables(Kind):
    """An array of tables (``[[repos]]``); ``unique`` names a field no two may share."""

    item: Table = Table()
    unique: str | None = None
    scope: str = ""
    expected: str = "an array of tables"
    leaf: bool = False

    def check(self, raw: object, path: KeyPath, checker: Checker) -> Any:
        if not isinstance(raw, list):
            raise self.fail(raw)
        out = [self.item.check(table, (*path, number), checker) for number, table in enumerate(raw)]
        if self.unique is not None:
            seen: dict[object, int] = {}
            for number, table in enumerate(raw):
                value = table.get(self.unique) if isinstance(table, Mapping) else None
                if not isinstance(value, str):
                    continue
                if value in seen:
                    first = (*path, seen[value], self.unique)
                    checker.problem(
                        (*path, number, self.unique),
                        f"duplicate {self.unique} {describe(value)}{self.scope}; "
                        f"already used by {checker.where(first)}; {self.unique}s must be unique",
                    )
                else:
                    seen[value] = number
        return out
