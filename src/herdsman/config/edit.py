"""``herdsman config set/add/remove``: edit the file in place, keeping everything else.

Each edit is resolved against the model and the file first
(:mod:`herdsman.config.resolve`: an unknown key or element is a usage error),
then made in the text, then checked twice before anything is written: the new
text must parse to exactly the old data with the one change applied (so no
other setting moved), and it must validate as a whole configuration. The
write is atomic.

What is edited where:

* a value that exists is replaced by tomlkit, which keeps the key, its
  spacing and its end-of-line comment;
* a new key goes after the last key of its own table, never under the
  comment that leads into the next table;
* a new table (``[providers.NAME]``) goes after the last table of its kind,
  and a new array element (``[[repos]]``) after the last element, each with
  a blank line before it (:mod:`herdsman.config.layout`);
* a removed table or element takes its header and body, not the comments
  that lead into what follows.

Tables written inline or with dotted keys are edited through tomlkit.
"""

from __future__ import annotations

import contextlib
import copy
import os
import stat
import tempfile
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import tomlkit
from tomlkit.container import Container
from tomlkit.exceptions import ParseError, TOMLKitError
from tomlkit.items import AoT, Array, InlineTable, Item, Table, Whitespace
from tomlkit.toml_document import TOMLDocument

from herdsman.config import kinds
from herdsman.config.keypath import KeyPath, format_key_path, parse_key_path
from herdsman.config.layout import (
    content_end_after,
    cut,
    element_span,
    insert_block,
    own_content_end,
    table_span,
)
from herdsman.config.load import LoadedConfig, load_config_text, read_config_text
from herdsman.config.model import Config
from herdsman.config.overrides import parse_value_text
from herdsman.config.positions import PositionIndex, parse_with_positions
from herdsman.config.problems import ConfigError, ConfigProblem, ConfigUsageError, Location
from herdsman.config.query import GetResult, get_value
from herdsman.config.render import inline_toml
from herdsman.config.resolve import lookup, parse_key

__all__ = [
    "EditResult",
    "GetResult",
    "add_element",
    "atomic_write",
    "get_value",
    "remove_key",
    "set_value",
]


@attrs.frozen
class EditResult:
    """A written edit: the key it changed, the file's text before and after, the new config."""

    path: Path
    old_text: str
    new_text: str
    loaded: LoadedConfig
    key: str = ""


@attrs.frozen
class _Source:
    """The file being edited, parsed."""

    path: Path
    text: str
    newline: str
    positions: PositionIndex
    data: dict[str, Any]

    def document(self) -> TOMLDocument:
        """A fresh tomlkit document of the text (each candidate edit mutates its own)."""
        return tomlkit.parse(self.text)


def _read(path: Path, environ: Mapping[str, str] | None) -> tuple[str, _Source]:
    old_text = read_config_text(path)
    newline = "\r\n" if "\r\n" in old_text else "\n"
    # An edit may append at the end: give the last line its newline first.
    text = old_text + newline if old_text and not old_text.endswith("\n") else old_text
    try:
        document, positions = parse_with_positions(text)
    except ParseError:
        load_config_text(old_text, path, environ=environ)  # raises the located syntax error
        raise  # pragma: no cover - load_config_text always raises here
    return old_text, _Source(path, text, newline, positions, document.unwrap())


def _finish(
    source: _Source,
    old_text: str,
    key: str,
    candidates: Iterator[str],
    *,
    expected: dict[str, Any],
    environ: Mapping[str, str] | None,
) -> EditResult:
    """Take the first candidate text that means exactly ``expected``; validate; write."""
    for candidate in candidates:
        # tomllib, not tomlkit: it follows the TOML spec strictly (tomlkit
        # accepts a table defined twice).
        try:
            if tomllib.loads(candidate) == expected:
                break
        except tomllib.TOMLDecodeError:
            continue
    else:
        raise ConfigError(
            [
                ConfigProblem(
                    Location(str(source.path)),
                    key,
                    "cannot be edited in place without changing other settings"
                    " (the file writes it in a way the editor does not follow); edit it by hand",
                )
            ]
        )
    loaded = load_config_text(candidate, source.path, environ=environ)
    atomic_write(source.path, candidate)
    return EditResult(source.path, old_text, candidate, loaded, key)


def set_value(
    path: Path, key: str, value_text: str, *, environ: Mapping[str, str] | None = None
) -> EditResult:
    """Set ``key`` to ``value_text`` (read like ``--set``) in the file at ``path``.

    Creates a missing key, or a missing table that the key belongs to. Raises
    :class:`ConfigUsageError` when ``key`` names nothing that can be set,
    :class:`ConfigError` when the edited file would be invalid; either way
    the file is not touched.
    """
    key_path = parse_key(key)
    old_text, source = _read(path, environ)
    resolved = lookup(key_path, source.data, source=path.name, create=True)
    text = format_key_path(key_path)
    if not resolved.kind.leaf:
        raise ConfigUsageError.one(text, _whole_table_hint(text, resolved.kind))
    value = parse_value_text(value_text)
    expected = copy.deepcopy(source.data)
    _assign_data(expected, key_path, value)
    candidates = _set_texts(source, key_path, value, exists=resolved.exists)
    return _finish(source, old_text, text, candidates, expected=expected, environ=environ)


def add_element(
    path: Path, key: str, fields: Sequence[str], *, environ: Mapping[str, str] | None = None
) -> EditResult:
    """Append an element to the array of tables ``key``, its fields given as ``KEY=VALUE``.

    The new element goes after the last one (or, for the first, after the
    table it belongs to). Field keys may be dotted (``env.TOKEN=x``).
    """
    key_path = parse_key(key)
    old_text, source = _read(path, environ)
    resolved = lookup(key_path, source.data, source=path.name, create=True)
    text = format_key_path(key_path)
    if not isinstance(resolved.kind, kinds.ArrayOfTables):
        raise ConfigUsageError.one(
            text,
            "is not an array of tables; `config add` appends an element to one, e.g."
            " `config add repos name=app path=~/src/app`",
        )
    element: dict[str, Any] = {}
    field_paths = []
    for field in fields:
        field_key, equals, value_text = field.partition("=")
        field_path = _field_path(field_key.strip(), equals, field)
        _assign_data(element, field_path, parse_value_text(value_text.strip()))
        field_paths.append(field_path)
    expected = copy.deepcopy(source.data)
    _parent_data(expected, key_path).setdefault(str(key_path[-1]), []).append(element)
    number = len(resolved.value) if isinstance(resolved.value, list) else 0
    for field_path in field_paths:  # checked like any key path: did you mean ...
        lookup((*key_path, number, *field_path), expected, source=path.name)
    candidates = _add_texts(source, key_path, element)
    return _finish(
        source, old_text, f"{text}[{number}]", candidates, expected=expected, environ=environ
    )


def remove_key(path: Path, key: str, *, environ: Mapping[str, str] | None = None) -> EditResult:
    """Remove ``key`` from the file: a setting (back to its default), a table, an element."""
    key_path = parse_key(key)
    old_text, source = _read(path, environ)
    resolved = lookup(key_path, source.data, source=path.name)
    text = format_key_path(key_path)
    if not resolved.exists:
        raise ConfigUsageError.one(text, f"not set in {path.name}; nothing to remove")
    expected = copy.deepcopy(source.data)
    parent = _parent_data(expected, key_path)
    del parent[key_path[-1]]
    if isinstance(key_path[-1], int) and not parent and isinstance(resolved.kind, kinds.Table):
        # The last element of an array of tables: the array goes with it.
        del _parent_data(expected, key_path[:-1])[key_path[-2]]
    return _finish(
        source, old_text, text, _remove_texts(source, key_path), expected=expected, environ=environ
    )


def _whole_table_hint(text: str, kind: kinds.Kind) -> str:
    if isinstance(kind, kinds.ArrayOfTables):
        return (
            f"is an array of tables; set a field of one element ({text}[0].KEY VALUE),"
            f" add an element (config add {text} KEY=VALUE ...) or remove one"
            f" (config remove '{text}[0]')"
        )
    return (
        f"is a table; set one of its keys ({text}.KEY VALUE), or remove it (config remove {text})"
    )


def _field_path(field_key: str, equals: str, field: str) -> KeyPath:
    if not equals or not field_key:
        raise ConfigUsageError.one(
            "", f"{field!r} must be KEY=VALUE, e.g. name=app or path=~/src/app"
        )
    try:
        field_path = parse_key_path(field_key)
    except ValueError as error:
        raise ConfigUsageError.one("", f"{field!r}: {error}") from None
    if any(isinstance(part, int) for part in field_path):
        raise ConfigUsageError.one("", f"{field!r}: a field key has no [N] parts")
    return field_path


# -- the data an edit must produce -------------------------------------------------------


def _parent_data(data: Any, path: KeyPath) -> Any:
    node = data
    for part in path[:-1]:
        node = node[part]
    return node


def _assign_data(data: dict[str, Any], path: KeyPath, value: Any) -> None:
    node: Any = data
    for part in path[:-1]:
        node = node[part] if isinstance(part, int) else node.setdefault(part, {})
    node[path[-1]] = value


# -- candidate texts ---------------------------------------------------------------------


def _key(part: str) -> str:
    return tomlkit.key(part).as_string()


def _header(path: KeyPath, *, element: bool = False) -> str:
    name = ".".join(_key(str(part)) for part in path)
    return f"[[{name}]]" if element else f"[{name}]"


def _nest(path: KeyPath, value: Any) -> Any:
    for part in reversed(path):
        value = {part: value}
    return value


def _item(value: Any) -> Item:
    """A value as tomlkit writes it on one line (tables inline)."""
    if isinstance(value, Mapping):
        table = tomlkit.inline_table()
        for key, child in value.items():
            table.append(key, _item(child))
        return table
    if isinstance(value, list):
        array = tomlkit.array()
        array.extend(_item(child) for child in value)
        return array
    item: Item = tomlkit.item(value)
    return item


def _kv_lines(fields: Mapping[str, Any], newline: str) -> str:
    return "".join(f"{_key(key)} = {inline_toml(value)}{newline}" for key, value in fields.items())


def _walk(document: TOMLDocument, path: KeyPath) -> tuple[Any, int]:
    """The deepest existing container on ``path`` and how many parts lead to it."""
    node: Any = document
    for depth, part in enumerate(path):
        try:
            child = node[part]
        except (KeyError, IndexError, TypeError):
            return node, depth
        if not isinstance(child, Container | Table | InlineTable | AoT | Array | dict | list):
            return node, depth
        node = child
    return node, len(path)


def _is_header_table(source: _Source, node: Any, at: KeyPath) -> bool:
    """Whether ``node`` (at ``at``) is opened by its own header in the text."""
    if isinstance(node, TOMLDocument):
        return True
    if not isinstance(node, Table):
        return False
    if at in source.positions.headers:
        return True
    # An element of an array of tables.
    return bool(at) and isinstance(at[-1], int)


def _append_kv(container: Any, key: str, value: Any, newline: str) -> None:
    """Put ``key = value`` after the last key of ``container``'s own body."""
    body: Container = container.value if isinstance(container, Table) else container
    last = -1
    for number, (name, item) in enumerate(body.body):
        if name is not None and not (isinstance(item, Table | AoT) and not name.is_dotted()):
            last = number
    if last < 0:
        # No key yet: after the comments under the header (they describe
        # this table), before the first blank line (what follows it leads
        # into the next table).
        for number, (name, item) in enumerate(body.body):
            if name is not None or isinstance(item, Whitespace):
                break
            last = number
    item = _item(value)
    item.trivia.trail = newline
    if last + 1 >= len(body.body):
        body.append(key, item)
    else:
        body._insert_at(last + 1, key, item)


def _set_texts(source: _Source, path: KeyPath, value: Any, *, exists: bool) -> Iterator[str]:
    document = source.document()
    if exists:  # replace the value, keep its line
        parent, _ = _walk(document, path[:-1])
        parent[path[-1]] = _item(value)
        yield document.as_string()
        return
    node, depth = _walk(document, path[:-1])
    at = path[:depth]
    rest = path[depth:]
    if isinstance(node, InlineTable | Array) or _dotted(document, at):
        node[rest[0]] = _item(_nest(rest[1:], value))  # tomlkit keeps inline and dotted styles
        yield document.as_string()
        return
    table_depth = _table_depth(path)
    if table_depth <= depth:
        line = _kv_lines({str(rest[0]): _nest(rest[1:], value)}, source.newline)
        yield from _insert_kv(source, at, line)
        if _is_header_table(source, node, at):
            _append_kv(node, str(rest[0]), _nest(rest[1:], value), source.newline)
            yield document.as_string()
            return
    # A new table: its header is the deepest table on the path; what is
    # below it is one key with an inline value.
    header = path[:table_depth]
    fields = {str(path[table_depth]): _nest(path[table_depth + 1 :], value)}
    block = _header(header) + source.newline + _kv_lines(fields, source.newline)
    yield from _insert_table(source, header, block)
    document = source.document()
    node, depth = _walk(document, path)
    node[path[depth]] = _item(_nest(path[depth + 1 :], value))
    yield document.as_string()


def _insert_kv(source: _Source, at: KeyPath, line: str) -> Iterator[str]:
    """``line`` after the last key under the header of the table at ``at``."""
    if not at:
        return
    number = at[-1] if isinstance(at[-1], int) else None
    name = tuple(str(part) for part in (at[:-1] if number is not None else at))
    if any(isinstance(part, int) for part in (at[:-1] if number is not None else at)):
        return
    offset = own_content_end(source.text, source.positions, name, number)
    if offset is not None:
        yield source.text[:offset] + line + source.text[offset:]


def _dotted(document: TOMLDocument, at: KeyPath) -> bool:
    """Whether the table at ``at`` is written as dotted keys (``env.A = "1"``)."""
    if not at or isinstance(at[-1], int):
        return False
    parent, depth = _walk(document, at[:-1])
    if depth < len(at) - 1:
        return False
    body = parent.value if isinstance(parent, Table) else parent
    if not isinstance(body, Container):
        return False
    return any(key is not None and key.key == at[-1] and key.is_dotted() for key, _ in body.body)


def _table_depth(path: KeyPath) -> int:
    """How many leading parts of ``path`` lead to the deepest table the model has on it.

    That table is the one a new key needs a header for; anything below it
    (``env``, caps) is a table-valued setting, written inline.
    """
    kind: kinds.Kind = kinds.Table(Config)
    depth = 0
    for number, part in enumerate(path[:-1]):
        if isinstance(kind, kinds.Table):
            kind = attrs.fields_dict(kind.cls)[str(part)].metadata["kind"]
        elif isinstance(kind, kinds.NamedTables | kinds.ArrayOfTables):
            kind = kind.item
        else:
            break
        if isinstance(kind, kinds.Table):
            depth = number + 1
    return depth


def _insert_table(source: _Source, header: KeyPath, block: str) -> Iterator[str]:
    """``block`` after the last table of its kind, else after its parent's, else at the end."""
    name = tuple(str(part) for part in header)
    for end in range(len(name), -1, -1):
        at = content_end_after(source.text, source.positions, name[:end])
        if at is not None:
            yield insert_block(source.text, at, block, source.newline)
            return
    yield insert_block(source.text, len(source.text), block, source.newline)


def _add_texts(source: _Source, path: KeyPath, element: dict[str, Any]) -> Iterator[str]:
    if not any(isinstance(part, int) for part in path):
        block = _header(path, element=True) + source.newline + _kv_lines(element, source.newline)
        yield from _insert_table(source, path, block)
    document = source.document()
    node, depth = _walk(document, path)
    if depth == len(path) and isinstance(node, Array):
        node.append(_item(element))  # an inline array of tables
    elif depth == len(path) and isinstance(node, AoT):
        node.append(tomlkit.item(element))
    else:
        node[path[depth]] = tomlkit.aot()
        node[path[depth]].append(tomlkit.item(element))
    yield document.as_string()


def _remove_texts(source: _Source, path: KeyPath) -> Iterator[str]:
    name = tuple(str(part) for part in path if isinstance(part, str))
    span: tuple[int, int] | None = None
    if isinstance(path[-1], int) and len(name) == len(path) - 1:
        span = element_span(source.text, source.positions, name, path[-1])
    elif not any(isinstance(part, int) for part in path):
        span = table_span(source.text, source.positions, name)
        if span is None:
            yield from _remove_elements(source, path)
    if span is not None:
        yield cut(source.text, *span, source.newline)
    document = source.document()
    parent, _ = _walk(document, path[:-1])
    del parent[path[-1]]
    yield document.as_string()


def _remove_elements(source: _Source, path: KeyPath) -> Iterator[str]:
    """A whole array of tables: each ``[[name]]`` element, last first."""
    name = tuple(str(part) for part in path)
    text = source.text
    positions = source.positions
    count = sum(1 for found, aot, _ in positions.header_order if found == name and aot)
    if not count:
        return
    for number in range(count - 1, -1, -1):
        span = element_span(text, positions, name, number)
        if span is None:
            return
        text = cut(text, *span, source.newline)
        try:
            _, positions = parse_with_positions(text)
        except TOMLKitError:
            return
    yield text


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
