"""``herdsman config get``: any effective value — a leaf, a table, an array of tables.

The effective configuration (:attr:`LoadedConfig.toml_values`, defaults
included) is rebuilt into nested data once; the key path is resolved against
it (:mod:`herdsman.config.resolve`), so a table prints exactly what
``check`` shows under it, and an unknown name gets the same hint as
everywhere else.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import attrs
import tomlkit

from herdsman.config import kinds
from herdsman.config.keypath import KeyPath, format_key_path, parse_key_path
from herdsman.config.load import LoadedConfig
from herdsman.config.problems import ConfigUsageError, Origin
from herdsman.config.render import inline_toml
from herdsman.config.resolve import lookup, parse_key

__all__ = ["GetResult", "effective_tree", "get_value", "render_toml"]


@attrs.frozen
class GetResult:
    """An effective value: its TOML text, its data and where it came from.

    ``toml`` and ``value`` are ``None`` when the key is not set and has no
    default. ``origins`` lists every setting the value is made of (one for a
    leaf, each leaf below a table), keyed by key path text.
    """

    key: str
    toml: str | None
    origin: Origin
    value: Any = None
    origins: Mapping[str, Origin] = attrs.field(factory=dict)


class _Leaf(dict[str, Any]):
    """A table-valued setting (``env``, caps): printed inline, not as a table."""


def effective_tree(loaded: LoadedConfig) -> dict[str, Any]:
    """Every effective value that has one, nested as in the file (defaults included)."""
    root: dict[str, Any] = {}
    for text, value in loaded.toml_values.items():
        if value is None:
            continue
        path = parse_key_path(text)
        node: Any = root
        for part, following in itertools.pairwise(path):
            if isinstance(part, int):
                while len(node) <= part:
                    node.append({})
                node = node[part]
            else:
                node = node.setdefault(part, [] if isinstance(following, int) else {})
        node[path[-1]] = _Leaf(value) if isinstance(value, Mapping) else value
    return root


def render_toml(path: KeyPath, value: Any) -> str:
    """``value`` as the TOML that writes it at ``path``: headers named in full.

    A leaf is one inline value (``4``, ``["claude", "-p"]``); a table or an
    array of tables is a fragment that could be pasted into the file.
    """
    if not isinstance(value, Mapping | list) or isinstance(value, _Leaf) or _plain_list(value):
        return inline_toml(_plain(value))
    item: Any = _toml(value)
    for part in reversed(path):
        if isinstance(part, int):
            element, item = item, tomlkit.aot()  # one element of an array of tables
            item.append(element)
            continue
        # Only the value's own tables get headers, not the ones around it.
        wrapper = tomlkit.table(is_super_table=True)
        wrapper.add(part, item)
        item = wrapper
    document = tomlkit.document()
    for key, child in item.items():
        document.add(key, child)
    return document.as_string().strip("\n")


def _plain_list(value: Any) -> bool:
    return isinstance(value, list) and not any(isinstance(v, Mapping) for v in value)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain(child) for key, child in value.items()}
    return value


def _toml(value: Any) -> Any:
    """Tables as tables, arrays of tables as such, table-valued settings inline."""
    if isinstance(value, _Leaf):
        inline = tomlkit.inline_table()
        inline.update(_plain(value))
        return inline
    if isinstance(value, Mapping):
        table = tomlkit.table()
        for key, child in value.items():
            table.add(key, _toml(child))
        return table
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        array = tomlkit.aot()
        for element in value:
            array.append(_toml(element))
        return array
    return value


def get_value(loaded: LoadedConfig, key: str) -> GetResult:
    """The effective value of ``key``; :class:`ConfigUsageError` if it names nothing."""
    path = parse_key(key)
    text = format_key_path(path)
    resolved = lookup(path, effective_tree(loaded), source=str(loaded.path))
    origins = {
        name: origin
        for name, origin in loaded.origins.items()
        if name == text or name.startswith((text + ".", text + "["))
    }
    if not origins:  # inside a leaf: an element of a list, an entry of a table
        for depth in range(len(path) - 1, 0, -1):
            parent = format_key_path(path[:depth])
            if parent in loaded.origins:
                origins = {parent: loaded.origins[parent]}
                break
    if not resolved.exists:
        if resolved.kind.leaf and text in loaded.toml_values:
            return GetResult(text, None, loaded.origins[text], None, origins)
        empty = _empty(resolved.kind)
        if empty is not None:  # no [[repos]] at all is a configuration without repos
            default = Origin("default")
            return GetResult(text, render_toml(path, empty), default, empty, {text: default})
        raise ConfigUsageError.one(text, f"not set (and no default) in {loaded.path}")
    kinds_of_origin = set(origins.values())
    origin = (
        kinds_of_origin.pop() if len(kinds_of_origin) == 1 else Origin("file", str(loaded.path))
    )
    value = _plain_tree(resolved.value)
    return GetResult(text, render_toml(path, resolved.value), origin, value, origins)


def _empty(kind: kinds.Kind) -> list[Any] | None:
    """An array of tables the file leaves out has none (``[]``); None for other kinds."""
    return [] if isinstance(kind, kinds.ArrayOfTables) else None


def _plain_tree(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _plain_tree(child) for key, child in value.items()}
    if isinstance(value, list):
        return [_plain_tree(child) for child in value]
    return value
