"""Line:column of every key path, on layouts that trip up naive approaches."""

from __future__ import annotations

import pytest
from tomlkit.exceptions import ParseError

from herdsman.config.keypath import parse_key_path
from herdsman.config.positions import parse_with_positions

TRICKY = """\
# comment mentioning concurrency = 9
[supervisor]
max_concurrency = 4   # trailing
"shutdown_grace" = "1m"

[providers.claude]
exec = [
  "claude",
  "-p",
]
env.FOO = "bar"
accounts = [ { name = "a" }, {name="b", env = { X = "1" }} ]

[scheduling]
agent_exclusive = false

[providers.claude.sub]   # out of order: [providers.claude] continues here
deep.er = 1

[[repos]]
name = "one"
[[repos]]

  name =   "two"
\tpath = "x"
"""


@pytest.mark.parametrize(
    ("key", "value", "key_pos"),
    [
        ("supervisor.max_concurrency", (3, 19), (3, 1)),
        ("supervisor.shutdown_grace", (4, 20), (4, 1)),
        ("providers.claude.exec", (7, 8), (7, 1)),
        ("providers.claude.exec[1]", (9, 3), None),
        ("providers.claude.env.FOO", (11, 11), (11, 5)),
        ("providers.claude.accounts[0].name", (12, 23), (12, 16)),
        ("providers.claude.accounts[1].name", (12, 36), (12, 31)),
        ("providers.claude.accounts[1].env.X", (12, 53), (12, 49)),
        ("scheduling.agent_exclusive", (15, 19), (15, 1)),
        ("providers.claude.sub.deep.er", (18, 11), (18, 6)),
        ("repos[0].name", (21, 8), (21, 1)),
        ("repos[1].name", (24, 12), (24, 3)),
        ("repos[1].path", (25, 9), (25, 2)),
    ],
)
def test_values_and_keys(key: str, value: tuple[int, int], key_pos: tuple[int, int] | None) -> None:
    _, index = parse_with_positions(TRICKY)
    path = parse_key_path(key)
    assert index.value(path) == value
    assert index.key(path) == key_pos


@pytest.mark.parametrize(
    ("key", "header"),
    [
        ("supervisor", (2, 1)),
        ("providers.claude", (6, 1)),
        ("providers.claude.sub", (17, 1)),
        ("repos[0]", (20, 1)),
        ("repos[1]", (22, 1)),
        ("providers", (6, 2)),  # implicit: the key inside the first header naming it
    ],
)
def test_table_headers(key: str, header: tuple[int, int]) -> None:
    _, index = parse_with_positions(TRICKY)
    assert index.header(parse_key_path(key)) == header


def test_document_round_trips_unchanged() -> None:
    document, _ = parse_with_positions(TRICKY)
    assert document.as_string() == TRICKY


def test_columns_count_characters_and_crlf_lines() -> None:
    text = 'name = "é"\r\n[t]\r\nkey = "ü" # ü\r\nother = 1\r\n'
    _, index = parse_with_positions(text)
    assert index.value(("t", "other")) == (4, 9)
    assert index.value(("t", "key")) == (3, 7)


def test_syntax_errors_raise_tomlkit_parse_errors() -> None:
    with pytest.raises(ParseError):
        parse_with_positions("a = = 1\n")
