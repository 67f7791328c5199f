"""Map every key path of a TOML document to the line and column it was written at.

tomlkit keeps no positions on its items, but its parser knows where it is at
every step. :class:`_RecordingParser` notes the source offset of each key part,
value and table header as it is parsed (by object identity); a walk over the
finished document then turns identities into key paths. This survives every
layout TOML allows (dotted keys, inline tables, arrays of tables, tables
defined out of order) because the parser, not a re-implementation of it,
decides what each character belongs to.

The recording hooks reach into tomlkit's parser methods; the tomlkit version is
pinned to a minor range in pyproject.toml and tests/unit/config/test_positions.py
exercises every layout, so a change there fails loudly instead of misplacing
errors.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from typing import Any

from tomlkit import TOMLDocument
from tomlkit.exceptions import ParseError, TOMLKitError
from tomlkit.items import AoT, Array, InlineTable, Item, Key, Table
from tomlkit.parser import Parser

from herdsman.config.keypath import KeyPath

__all__ = ["PositionIndex", "parse_with_positions"]

LineCol = tuple[int, int]

_PARSE_POSITION = re.compile(r"\s+at line \d+ col \d+$")


class _RecordingParser(Parser):
    """A tomlkit parser that records where keys, values and headers start."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.offsets: dict[int, int] = {}
        self.headers: list[tuple[tuple[str, ...], bool, int]] = []
        self.key_starts: list[tuple[int, Key]] = []

    def duplicate_offset(self, message: str) -> int | None:
        """Where the key named in a "Key ... already exists" message was last written."""
        match = re.fullmatch(r'Key "(.*)" already exists\.', message)
        if match is None:
            return None
        for start, key in reversed(self.key_starts):
            if any(match[1] in (part.key, part.as_string()) for part in key):
                return start
        return None

    def _parse_key(self) -> Key:
        start = self._idx
        key = super()._parse_key()
        self.key_starts.append((start, key))
        return key

    def _parse_bare_key(self) -> Key:
        start = self._idx
        key = super()._parse_bare_key()
        self.offsets[id(key)] = start
        return key

    def _parse_quoted_key(self) -> Key:
        start = self._idx
        key = super()._parse_quoted_key()
        self.offsets[id(key)] = start
        return key

    def _parse_value(self) -> Item:
        start = self._idx
        value = super()._parse_value()
        self.offsets[id(value)] = start
        return value

    def _parse_table(
        self, parent_name: Key | None = None, parent: Table | None = None
    ) -> tuple[Key, Table | AoT]:
        start = self._idx
        is_aot, name = self._peek_table()
        self.headers.append((tuple(part.key for part in name), is_aot, start))
        return super()._parse_table(parent_name, parent)


class PositionIndex:
    """Line and column (both 1-based) of keys, values and table headers by key path."""

    def __init__(self, text: str) -> None:
        self._line_starts = [0]
        self._line_starts.extend(i + 1 for i, char in enumerate(text) if char == "\n")
        self.keys: dict[KeyPath, int] = {}
        self.values: dict[KeyPath, int] = {}
        self.headers: dict[KeyPath, int] = {}
        #: Every ``[table]`` and ``[[array]]`` header in file order: its
        #: name (no element numbers), whether it opens an array element, and
        #: the offset of its first character.
        self.header_order: list[tuple[tuple[str, ...], bool, int]] = []

    def line_col(self, offset: int) -> LineCol:
        """The 1-based line and column of a character offset."""
        line = bisect.bisect_right(self._line_starts, offset)
        return line, offset - self._line_starts[line - 1] + 1

    def _line_col(self, offset: int | None) -> LineCol | None:
        return None if offset is None else self.line_col(offset)

    def key(self, path: KeyPath) -> LineCol | None:
        """Where the key of ``path`` was first written (for "unknown key")."""
        return self._line_col(self.keys.get(path))

    def value(self, path: KeyPath) -> LineCol | None:
        """Where the value of ``path`` starts (a table's header for a table)."""
        for table in (self.values, self.headers, self.keys):
            if path in table:
                return self._line_col(table[path])
        return None

    def header(self, path: KeyPath) -> LineCol | None:
        """Where the table at ``path`` is opened (for "missing required key")."""
        for table in (self.headers, self.values, self.keys):
            if path in table:
                return self._line_col(table[path])
        return None

    def __contains__(self, path: KeyPath) -> bool:
        return path in self.keys or path in self.values or path in self.headers


def parse_with_positions(text: str) -> tuple[TOMLDocument, PositionIndex]:
    """Parse ``text`` with tomlkit and index the position of every key path.

    Raises :class:`tomlkit.exceptions.ParseError` for a syntax error.
    """
    parser = _RecordingParser(text)
    try:
        document = parser.parse()
    except TOMLKitError as error:
        # A key or table defined twice is noticed only once the enclosing
        # table is complete, so tomlkit places it late or not at all. Point at
        # the latest key written with that name instead: the second definition.
        message = _PARSE_POSITION.sub("", str(error))
        offset = parser.duplicate_offset(message)
        if offset is not None:
            line, col = PositionIndex(text).line_col(offset)
            raise ParseError(line, col - 1, message) from error
        if isinstance(error, ParseError):
            raise
        raise parser.parse_error(ParseError, message) from error
    index = PositionIndex(text)
    aot_counts: Counter[tuple[str, ...]] = Counter()
    index.header_order = list(parser.headers)
    for name, is_aot, offset in parser.headers:
        if is_aot:
            index.headers[(*name, aot_counts[name])] = offset
            aot_counts[name] += 1
        index.headers.setdefault(name, offset)
    _walk_body(document.body, (), parser.offsets, index)
    return document, index


def _walk_body(
    body: list[tuple[Key | None, Any]],
    prefix: KeyPath,
    offsets: dict[int, int],
    index: PositionIndex,
) -> None:
    for key, item in body:
        if key is None:
            continue  # whitespace and comments
        path = prefix
        for part in key:  # a dotted key iterates over its parts
            path = (*path, part.key)
            if id(part) in offsets:
                index.keys.setdefault(path, offsets[id(part)])
        _walk_item(item, path, offsets, index)


def _walk_item(item: Item, path: KeyPath, offsets: dict[int, int], index: PositionIndex) -> None:
    if id(item) in offsets:
        index.values.setdefault(path, offsets[id(item)])
    if isinstance(item, Table | InlineTable):
        _walk_body(item.value.body, path, offsets, index)
    elif isinstance(item, AoT):
        for number, table in enumerate(item.body):
            _walk_item(table, (*path, number), offsets, index)
    elif isinstance(item, Array):
        # Array subclasses list; its list items are the parsed Items.
        for number, element in enumerate(list.__iter__(item)):
            _walk_item(element, (*path, number), offsets, index)
