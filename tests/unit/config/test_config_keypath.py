"""Key path text ↔ tuple."""

from __future__ import annotations

import pytest

from herdsman.config import format_key_path, parse_key_path
from herdsman.config.keypath import KeyPath, KeyPathError


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("supervisor.max_concurrency", ("supervisor", "max_concurrency")),
        ("providers.claude.accounts[1].name", ("providers", "claude", "accounts", 1, "name")),
        ("repos[0]", ("repos", 0)),
        ('providers.claude.env."A.B"', ("providers", "claude", "env", "A.B")),
        ("providers.claude.exec[2]", ("providers", "claude", "exec", 2)),
    ],
)
def test_round_trips(text: str, path: KeyPath) -> None:
    assert parse_key_path(text) == path
    assert format_key_path(path) == text


@pytest.mark.parametrize("text", ["", "a.", ".a", "a..b", "[0]", "a.[0]", "a b", "a[x]", "a[0]b"])
def test_rejects_malformed_paths(text: str) -> None:
    with pytest.raises(KeyPathError, match="malformed key"):
        parse_key_path(text)
