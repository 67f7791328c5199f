"""Where a new table goes in a file's text, and what text a table spans.

tomlkit keeps a file's bytes, but files the comments and blank lines between
two tables under the first one: the comment that introduces ``[[repos]]`` is
part of the table before it. Adding or removing whole tables through it would
put a new table under that comment, or take the comment away with the table.
These helpers work on the text and the header offsets the parser recorded
(:mod:`herdsman.config.positions`) instead: a table's *content* ends at its
last line that is neither blank nor a comment, and what follows belongs to
what comes next.
"""

from __future__ import annotations

from collections.abc import Sequence

from herdsman.config.positions import PositionIndex

__all__ = [
    "content_end_after",
    "cut",
    "element_span",
    "insert_block",
    "own_content_end",
    "table_span",
]

Headers = Sequence[tuple[tuple[str, ...], bool, int]]


def _line_start(text: str, offset: int) -> int:
    return text.rfind("\n", 0, offset) + 1


def _line_end(text: str, offset: int) -> int:
    """The offset just past the newline of the line holding ``offset``."""
    end = text.find("\n", offset)
    return len(text) if end < 0 else end + 1


def _content_end(text: str, start: int, end: int) -> int:
    """Back up from ``end`` (a line start) over blank and comment lines, not before ``start``."""
    pos = end
    while pos > start:
        line_start = _line_start(text, pos - 1)
        line = text[line_start:pos].strip()
        if line and not line.startswith("#"):
            break
        pos = line_start
    return max(pos, start)


def _region_end(text: str, headers: Headers, last: int) -> int:
    """Where the content of the table opened by ``headers[last]`` ends."""
    after_header = _line_end(text, headers[last][2])
    following = _line_start(text, headers[last + 1][2]) if last + 1 < len(headers) else len(text)
    return _content_end(text, after_header, following)


def content_end_after(text: str, index: PositionIndex, prefix: tuple[str, ...]) -> int | None:
    """Just past the content of the last table whose name starts with ``prefix``.

    ``None`` when no header has that prefix. A new table of that kind goes
    here: after its last sibling, before the comment that leads into the next.
    """
    headers = index.header_order
    matching = [i for i, (name, _, _) in enumerate(headers) if name[: len(prefix)] == prefix]
    if not matching:
        return None
    return _region_end(text, headers, matching[-1])


def own_content_end(
    text: str, index: PositionIndex, name: tuple[str, ...], number: int | None
) -> int | None:
    """Just past the last key under the header of table ``name`` (or of its
    ``number``-th element), before its sub-tables: where a new key of it goes.

    ``None`` when the table has no header of its own.
    """
    headers = index.header_order
    if number is None:
        found = [i for i, (n, aot, _) in enumerate(headers) if n == name and not aot]
    else:
        found = [i for i, (n, aot, _) in enumerate(headers) if n == name and aot][number:]
    if not found:
        return None
    return _region_end(text, headers, found[0])


def table_span(text: str, index: PositionIndex, name: tuple[str, ...]) -> tuple[int, int] | None:
    """The text of the header table ``name`` and its sub-tables, if written in one piece."""
    headers = index.header_order
    matching = [i for i, (found, _, _) in enumerate(headers) if found[: len(name)] == name]
    if not matching or matching != list(range(matching[0], matching[-1] + 1)):
        return None
    if headers[matching[0]][0] != name:
        return None  # only sub-tables have headers: the table itself is written elsewhere
    return _line_start(text, headers[matching[0]][2]), _region_end(text, headers, matching[-1])


def element_span(
    text: str, index: PositionIndex, name: tuple[str, ...], number: int
) -> tuple[int, int] | None:
    """The text of the ``number``-th ``[[name]]`` element, with its sub-tables."""
    headers = index.header_order
    opening = [i for i, (found, aot, _) in enumerate(headers) if found == name and aot]
    if number >= len(opening):
        return None
    first = last = opening[number]
    while last + 1 < len(headers):
        found = headers[last + 1][0]
        if found == name or found[: len(name)] != name:
            break
        last += 1
    return _line_start(text, headers[first][2]), _region_end(text, headers, last)


def insert_block(text: str, at: int, block: str, newline: str) -> str:
    """Insert ``block`` (whole lines) at the line start ``at``, a blank line before it."""
    before, after = text[:at], text[at:]
    if before and not before.endswith("\n"):
        before += newline
    if before.strip() and not before.endswith(newline * 2):
        block = newline + block
    if after.strip() and not after.startswith(("\n", "\r\n")):
        block += newline  # keep the table that follows set apart too
    return before + block + after


def cut(text: str, start: int, end: int, newline: str) -> str:
    """Remove ``text[start:end]`` (whole lines), leaving no doubled blank line behind."""
    before, after = text[:start], text[end:]
    if before.endswith(newline * 2) and (after.startswith(newline) or not after.strip()):
        before = before[: -len(newline)]
    elif not before.strip():
        after = after.lstrip("\r\n")
    return before + after
