"""Resolve a key path against the model and the data it addresses.

Every place that takes a key path from a user — ``config get/set/add/remove``,
``--set KEY=VALUE`` and ``sim plan --vary`` (which applies its values as
``--set``) — goes through :func:`resolve`, so each says the same thing about a
path that names nothing: an unknown key or table name gets the closest known
one ("did you mean"), an element past the end says how many there are.

Resolution walks the model's kinds (:mod:`herdsman.config.kinds`) and the raw
data side by side. A leaf that is absent is not an error here (it may have a
default, or be about to be set); a *table* that is absent is, unless the path
creates it: a new ``[providers.NAME]`` starts with a key it requires
(``providers.NAME.exec``), so that a typo in an existing name
(``providers.claud.concurrency``) is caught instead of read as a new,
incomplete provider.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from herdsman.config import kinds
from herdsman.config.keypath import KeyPath, KeyPathError, format_key_path, parse_key_path
from herdsman.config.model import Config
from herdsman.config.problems import ConfigUsageError

__all__ = [
    "KeyPathProblem",
    "Resolved",
    "lookup",
    "parse_key",
    "required_fields",
    "resolve",
    "unknown_key_message",
]

_ABSENT: Any = object()


def unknown_key_message(key: str, names: Sequence[str]) -> str:
    """ "unknown key" with the closest known name (difflib), else the whole list."""
    close = difflib.get_close_matches(key, names, n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"expected one of: {', '.join(names)}"
    return f"unknown key; {hint}"


class KeyPathProblem(ValueError):
    """A key path that names nothing: ``key`` is the part that went wrong."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.key = key
        self.message = message


@attrs.frozen
class Resolved:
    """What a key path names: its kind, and whether the data holds it."""

    path: KeyPath
    kind: kinds.Kind
    exists: bool
    value: Any = None


def required_fields(table: kinds.Table) -> list[str]:
    """The fields of ``table`` that have no default (a new table must set them)."""
    return [
        field.name
        for field in attrs.fields(table.cls)
        if field.default is attrs.NOTHING and field.metadata["default_from"] is None
    ]


def resolve(path: KeyPath, data: Any, *, source: str, create: bool = False) -> Resolved:
    """Walk ``path`` through the model and ``data`` (nested dicts and lists).

    ``source`` names the data in messages (``supervisor.toml``). With
    ``create``, the path may end in or run through tables and keys the data
    lacks, as long as a new named table starts with a key it requires.
    Raises :class:`KeyPathProblem`.
    """
    kind: kinds.Kind = kinds.Table(Config)
    node = data
    for depth, part in enumerate(path):
        here = format_key_path(path[: depth + 1])
        parent = format_key_path(path[:depth])
        rest = path[depth + 1 :]
        if isinstance(kind, kinds.Table):
            names = [field.name for field in attrs.fields(kind.cls)]
            if not isinstance(part, str):
                raise KeyPathProblem("", f"{parent} is a table, not an array; it has no [{part}]")
            if part not in names:
                raise KeyPathProblem(here, unknown_key_message(part, names))
            kind = attrs.fields_dict(kind.cls)[part].metadata["kind"]
        elif isinstance(kind, kinds.NamedTables):
            if not isinstance(part, str):
                raise KeyPathProblem(
                    "", f"{parent} is a table of tables; name one, e.g. {parent}.NAME, not [{part}]"
                )
            if _child(node, part) is _ABSENT:
                _check_new_table(kind, node, here, part, rest, source, create)
            kind = kind.item
        elif isinstance(kind, kinds.ArrayOfTables):
            if not isinstance(part, int):
                raise KeyPathProblem(
                    "", f"{parent} is an array of tables; pick an element, e.g. {parent}[0].{part}"
                )
            if _child(node, part) is _ABSENT:
                raise KeyPathProblem("", f"{parent} has no element [{part}]; {_count(node)}")
            kind = kind.item
        elif isinstance(kind, kinds.StringList):
            if not isinstance(part, int):
                raise KeyPathProblem("", f"{parent} is a list; it has no part {part!r}")
            if _child(node, part) is _ABSENT:
                raise KeyPathProblem("", f"{parent} has no element [{part}]; {_count(node)}")
            kind = kinds.Kind()
        elif isinstance(kind, kinds.StringTable | kinds.Caps) and isinstance(part, str):
            nested = isinstance(kind, kinds.Caps) and kind.nested
            kind = kinds.Caps() if nested else kinds.Kind()
        else:
            raise KeyPathProblem("", f"{parent} has no part {part!r}")
        node = _child(node, part)
    return Resolved(path, kind, node is not _ABSENT, None if node is _ABSENT else node)


def _child(node: Any, part: str | int) -> Any:
    if isinstance(part, int):
        if isinstance(node, Sequence) and not isinstance(node, str) and 0 <= part < len(node):
            return node[part]
        return _ABSENT
    if isinstance(node, Mapping) and part in node:
        return node[part]
    return _ABSENT


def _count(node: Any) -> str:
    size = len(node) if isinstance(node, Sequence) and not isinstance(node, str) else 0
    if size == 0:
        return "it has none"
    return f"it has {size} ([0] to [{size - 1}])" if size > 1 else "it has 1 ([0])"


def _check_new_table(  # noqa: PLR0917 -- one call site, all of the walk's state
    kind: kinds.NamedTables,
    node: Any,
    here: str,
    name: str,
    rest: KeyPath,
    source: str,
    create: bool,
) -> None:
    """A named table the data lacks: fine only when the path creates it properly."""
    known = [str(key) for key in node] if isinstance(node, Mapping) else []
    required = required_fields(kind.item)
    if create and (not rest or rest[0] in required or not required):
        return
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        hint = f"did you mean '{close[0]}'?"
    elif known:
        hint = f"the names there are: {', '.join(known)}"
    else:
        hint = "there are none"
    if create:
        hint += f" (to add a new one, set {here}.{required[0]} first)"
    raise KeyPathProblem(here, f"not in {source}; {hint}")


def parse_key(text: str) -> KeyPath:
    """Parse a key path given on the command line; :class:`ConfigUsageError` if malformed."""
    try:
        return parse_key_path(text)
    except KeyPathError as error:
        raise ConfigUsageError.one("", str(error)) from None


def lookup(path: KeyPath, data: Any, *, source: str, create: bool = False) -> Resolved:
    """:func:`resolve` for a command: a path that names nothing is a :class:`ConfigUsageError`."""
    try:
        return resolve(path, data, source=source, create=create)
    except KeyPathProblem as problem:
        raise ConfigUsageError.one(problem.key, problem.message) from None
