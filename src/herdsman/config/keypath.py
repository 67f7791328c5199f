"""Key paths: ``providers.claude.accounts[1].name`` and its tuple form.

A key path is a tuple of parts: ``str`` for a table key, ``int`` for a
zero-based position in an array (of tables). The text form quotes a key that
is not a bare TOML key, so every path prints unambiguously.
"""

from __future__ import annotations

import json
import re

__all__ = ["KeyPath", "KeyPathError", "format_key_path", "parse_key_path"]

KeyPath = tuple[str | int, ...]

_BARE = re.compile(r"[A-Za-z0-9_-]+")
_TOKEN = re.compile(r'(?P<bare>[A-Za-z0-9_-]+)|(?P<quoted>"(?:[^"\\]|\\.)*")|\[(?P<index>\d+)\]')


class KeyPathError(ValueError):
    """A key path given on the command line is malformed."""


def format_key_path(path: KeyPath) -> str:
    """Render a key path, e.g. ``("repos", 0, "name")`` → ``repos[0].name``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = part if _BARE.fullmatch(part) else json.dumps(part)
        out += f".{text}" if out else text
    return out


def parse_key_path(text: str) -> KeyPath:
    """Parse the text form written by :func:`format_key_path`.

    Raises :class:`KeyPathError` for anything else (empty parts, stray dots).
    """
    parts: list[str | int] = []
    pos = 0
    expect_key = True
    while pos < len(text):
        if not expect_key and text[pos] == ".":
            pos += 1
            expect_key = True
            continue
        match = _TOKEN.match(text, pos)
        if match is None:
            raise KeyPathError(
                f"malformed key {text!r} at character {pos + 1}; a key is names joined by"
                " '.' with an element's index in brackets, e.g. repos[0].path"
            )
        if match["index"] is not None:
            if expect_key:
                raise KeyPathError(f"malformed key {text!r}: a key is missing before '['")
            parts.append(int(match["index"]))
        elif not expect_key:
            raise KeyPathError(f"malformed key {text!r}: expected '.' at character {pos + 1}")
        elif match["bare"] is not None:
            parts.append(match["bare"])
        else:
            parts.append(str(json.loads(match["quoted"])))
        expect_key = False
        pos = match.end()
    if expect_key:
        raise KeyPathError(f"malformed key {text!r}: a key is missing")
    return tuple(parts)
