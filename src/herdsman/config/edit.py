"""``herdsman config get/set``: read one effective value; edit the file in place.

Edits go through tomlkit, so everything outside the changed value (comments,
blank lines, key order, quoting) keeps its bytes. The edited text is validated
as a whole before anything is written, and written atomically.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import tomlkit
from tomlkit.container import Container
from tomlkit.exceptions import ParseError
from tomlkit.items import AoT, Table
from tomlkit.toml_document import TOMLDocument

from herdsman.config import kinds
from herdsman.config.keypath import KeyPath, KeyPathError, format_key_path, parse_key_path
from herdsman.config.load import LoadedConfig, load_config_text, read_config_text
from herdsman.config.model import Config
from herdsman.config.overrides import parse_value_text
from herdsman.config.problems import ConfigError, ConfigProblem, Location, Origin
from herdsman.config.render import inline_toml
from herdsman.config.validate import unknown_key_message

__all__ = ["EditResult", "GetResult", "atomic_write", "get_value", "set_value"]


@attrs.frozen
class GetResult:
    """The TOML text of an effective value and where it came from.

    ``toml`` is ``None`` when the key is not set and has no default.
    """

    key: str
    toml: str | None
    origin: Origin


@attrs.frozen
class EditResult:
    """A successful ``config set``: the file's text before and after, and the new config."""

    path: Path
    old_text: str
    new_text: str
    loaded: LoadedConfig


def _fail(key: str, message: str) -> ConfigError:
    return ConfigError([ConfigProblem(Location(""), key, message)])


def _parse_key(key: str) -> KeyPath:
    try:
        return parse_key_path(key)
    except KeyPathError as error:
        raise _fail("", str(error)) from None


def _check_schema(path: KeyPath) -> None:
    """Reject key paths the model does not have, with a did-you-mean hint."""
    kind: kinds.Kind = kinds.Table(Config)
    for depth, part in enumerate(path):
        here = format_key_path(path[: depth + 1])
        if isinstance(kind, kinds.Table):
            names = [field.name for field in attrs.fields(kind.cls)]
            if part not in names:
                raise _fail(here, unknown_key_message(str(part), names))
            kind = attrs.fields_dict(kind.cls)[str(part)].metadata["kind"]
        elif isinstance(kind, kinds.NamedTables) and isinstance(part, str):
            kind = kind.item
        elif isinstance(kind, kinds.ArrayOfTables | kinds.StringList) and isinstance(part, int):
            kind = kind.item if isinstance(kind, kinds.ArrayOfTables) else kinds.Kind()
        elif isinstance(kind, kinds.StringTable) and isinstance(part, str):
            kind = kinds.Kind()  # an entry: a plain value, nothing lies below it
        else:
            raise _fail(here, f"{format_key_path(path[:depth])} has no part {part!r}")


def get_value(loaded: LoadedConfig, key: str) -> GetResult:
    """The effective value of ``key`` as TOML text, or :class:`ConfigError` if unknown."""
    path = _parse_key(key)
    _check_schema(path)
    text = format_key_path(path)
    if text in loaded.toml_values:
        value = loaded.toml_values[text]
        rendered = None if value is None else inline_toml(value)
        return GetResult(text, rendered, loaded.origins[text])
    # Inside a leaf: an element of a list or an entry of an env table.
    for depth in range(len(path) - 1, 0, -1):
        parent = format_key_path(path[:depth])
        if parent in loaded.toml_values:
            value = _descend(loaded.toml_values[parent], path[depth:])
            if value is None:
                raise _fail(text, f"not set (and no default) in {loaded.path}")
            return GetResult(text, inline_toml(value), loaded.origins[parent])
    # A table: everything under it, as TOML.
    prefix = (text + ".", text + "[")
    below = {k: v for k, v in loaded.toml_values.items() if k.startswith(prefix)}
    if not below:
        raise _fail(text, f"not defined in {loaded.path}")
    nested = _nest(below, len(path))
    origins = {loaded.origins[k] for k in below}
    origin = origins.pop() if len(origins) == 1 else Origin("file", str(loaded.path), 0)
    return GetResult(text, tomlkit.dumps(nested).rstrip("\n"), origin)


def _descend(value: Any, rest: KeyPath) -> Any:
    for part in rest:
        fits_list = isinstance(part, int) and isinstance(value, list) and part < len(value)
        if fits_list or (isinstance(part, str) and isinstance(value, Mapping) and part in value):
            value = value[part]
        else:
            return None
    return value


def _nest(flat: Mapping[str, Any], skip: int) -> dict[str, Any]:
    """Rebuild nested TOML data from ``key.path → value`` entries below a table."""
    root: dict[str, Any] = {}
    for text, value in flat.items():
        if value is None:
            continue
        path = parse_key_path(text)[skip:]
        node: Any = root
        for part, following in itertools.pairwise(path):
            if isinstance(part, int):
                while len(node) <= part:
                    node.append({})
                node = node[part]
            else:
                node = node.setdefault(part, [] if isinstance(following, int) else {})
        node[path[-1]] = value
    return root


def set_value(
    path: Path, key: str, value_text: str, *, environ: Mapping[str, str] | None = None
) -> EditResult:
    """Set ``key`` to ``value_text`` (read like ``--set``) in the file at ``path``.

    Creates missing tables. The whole edited file is validated first; on any
    problem :class:`ConfigError` is raised and the file is not touched.
    """
    key_path = _parse_key(key)
    _check_schema(key_path)
    old_text = read_config_text(path)
    try:
        document = tomlkit.parse(old_text)
    except ParseError:
        load_config_text(old_text, path, environ=environ)  # raises the located syntax error
        raise  # pragma: no cover - load_config_text always raises here
    _assign(document, key_path, parse_value_text(value_text))
    new_text = document.as_string()
    if new_text and not new_text.endswith("\n") and (not old_text or old_text.endswith("\n")):
        new_text += "\n"  # tomlkit leaves an appended table unterminated
    loaded = load_config_text(new_text, path, environ=environ)
    atomic_write(path, new_text)
    return EditResult(path, old_text, new_text, loaded)


def _assign(document: TOMLDocument, path: KeyPath, value: Any) -> None:
    node: Any = document
    for depth, part in enumerate(path[:-1]):
        here = format_key_path(path[: depth + 1])
        if isinstance(part, int):
            if not isinstance(node, AoT | list) or part >= len(node):
                raise _fail(
                    format_key_path(path),
                    f"{format_key_path(path[:depth])} has no element [{part}]",
                )
            node = node[part]
            continue
        if part not in node:
            # Intermediate tables are "super tables": no bare [providers]
            # header is written for them, only [providers.NAME].
            node[part] = tomlkit.table(is_super_table=depth < len(path) - 2)
        node = node[part]
        wants_array = isinstance(path[depth + 1], int)
        if not isinstance(node, (AoT | list) if wants_array else (Table | Container | dict)):
            raise _fail(
                format_key_path(path), f"{here} is not {'an array' if wants_array else 'a table'}"
            )
    last = path[-1]
    if isinstance(last, int) and (not isinstance(node, list) or last >= len(node)):
        raise _fail(format_key_path(path), f"{format_key_path(path[:-1])} has no element [{last}]")
    node[last] = value


def atomic_write(path: Path, text: str) -> None:
    """Replace the file at ``path`` with ``text`` atomically, keeping its permission bits.

    Writes a temporary file in the same directory, fsyncs it, then renames it
    over the original, so readers see the old or the new file, never a torn
    one. A symlink is followed, so the link stays a link.
    """
    target = Path(os.path.realpath(path))
    mode = stat.S_IMODE(target.stat().st_mode)
    descriptor, temporary = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)
