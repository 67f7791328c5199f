"""``--set KEY=VALUE``: parse overrides and apply them to raw TOML data.

VALUE is read as a TOML value (``3``, ``"15m"``, ``["claude", "-p"]``); a bare
word that is not valid TOML (``15m``, ``127.0.0.1:9000``) is taken as a string,
so quoting is only needed where TOML would read the text as something else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import tomlkit
from tomlkit.exceptions import TOMLKitError

from herdsman.config.keypath import KeyPath, KeyPathError, format_key_path, parse_key_path
from herdsman.config.problems import ConfigProblem, Location
from herdsman.config.resolve import KeyPathProblem, resolve

__all__ = ["Override", "apply_overrides", "parse_override", "parse_value_text"]


@attrs.frozen
class Override:
    """One ``--set`` argument: its text, its position among the others, key and value."""

    text: str
    index: int
    path: KeyPath
    value: Any


def parse_value_text(text: str) -> Any:
    """Read ``text`` as one TOML value, or as a plain string if it is not valid TOML."""
    try:
        return tomlkit.value(text).unwrap()
    except (TOMLKitError, ValueError):
        return text


def parse_override(text: str, index: int) -> Override:
    """Parse ``KEY=VALUE``; raises :class:`ValueError` with the reason if malformed."""
    key, equals, value = text.partition("=")
    if not equals:
        raise ValueError("must be KEY=VALUE, e.g. providers.claude.concurrency=2")
    try:
        path = parse_key_path(key.strip())
    except KeyPathError as error:
        raise ValueError(str(error)) from None
    return Override(text, index, path, parse_value_text(value.strip()))


def apply_overrides(
    data: dict[str, Any], texts: Sequence[str]
) -> tuple[list[Override], list[ConfigProblem]]:
    """Apply each ``--set`` to ``data`` in place, creating tables as needed."""
    applied: list[Override] = []
    problems: list[ConfigProblem] = []
    for index, text in enumerate(texts):
        try:
            override = parse_override(text, index)
            resolve(override.path, data, source="the configuration", create=True)
            _assign(data, override.path, override.value)
        except KeyPathProblem as error:
            problems.append(ConfigProblem(Location.override(text, index), error.key, error.message))
            continue
        except ValueError as error:
            problems.append(ConfigProblem(Location.override(text, index), "", str(error)))
            continue
        applied.append(override)
    return applied, problems


class _Unassignable(ValueError):
    """The key path of an override runs through something that is not a table."""


def _assign(data: dict[str, Any], path: KeyPath, value: Any) -> None:
    node: Any = data
    for depth, part in enumerate(path):
        last = depth == len(path) - 1
        where = format_key_path(path[:depth]) or "the top level"
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise _Unassignable(f"{where} has no element [{part}]")
            if last:
                node[part] = value
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise _Unassignable(f"cannot set {format_key_path(path)}: {where} is not a table")
        if last:
            node[part] = value
        elif isinstance(path[depth + 1], int) and part not in node:
            raise _Unassignable(
                f"{format_key_path(path[: depth + 1])} has no element [{path[depth + 1]}]"
            )
        else:
            node = node.setdefault(part, {})
