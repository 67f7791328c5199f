"""``config get``: the effective value of one key, as TOML."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from typing import Any

import pytest

from herdsman.config import ConfigUsageError, LoadedConfig, get_value, parse_key_path

Load = Callable[..., LoadedConfig]
TEXT = """\
[providers.claude]
exec = ["claude", "-p"]
concurrency = 4
timeout = "1h30m"
env = { TOKEN = "x" }

[[providers.claude.accounts]]
name = "work"
window = "5h"
"""


@pytest.mark.parametrize(
    ("key", "toml", "origin"),
    [
        ("providers.claude.concurrency", "4", "supervisor.toml:3"),
        ("providers.claude.timeout", '"1h30m"', "supervisor.toml:4"),
        ("providers.claude.exec", '["claude", "-p"]', "supervisor.toml:2"),
        ("providers.claude.exec[1]", '"-p"', "supervisor.toml:2"),
        ("providers.claude.env", '{TOKEN = "x"}', "supervisor.toml:5"),
        ("providers.claude.env.TOKEN", '"x"', "supervisor.toml:5"),
        ("providers.claude.idle_timeout", '"15m"', "default"),
        ("providers.claude.accounts[0].window", '"5h"', "supervisor.toml:9"),
        ("providers.claude.accounts[0].budget_unit", '"runs"', "default"),
        ("api.listen", '"127.0.0.1:7878"', "default"),
        ("scheduling.agent_exclusive", "true", "default"),
        ("supervisor.max_concurrency", None, "default"),
    ],
)
def test_effective_values(load: Load, key: str, toml: str | None, origin: str) -> None:
    result = get_value(load(TEXT), key)
    assert result.toml == toml
    assert str(result.origin).rpartition("/")[2] == origin


def test_an_element_prints_as_toml_that_writes_it(load: Load) -> None:
    result = get_value(load(TEXT), "providers.claude.accounts[0]")
    assert result.toml == (
        '[[providers.claude.accounts]]\nname = "work"\nenv = {}\nwindow = "5h"\n'
        'budget_unit = "runs"'
    )
    assert result.value == {"name": "work", "env": {}, "window": "5h", "budget_unit": "runs"}
    assert str(result.origins["providers.claude.accounts[0].window"]).endswith("supervisor.toml:9")


@pytest.mark.parametrize(
    ("key", "first_line"),
    [
        ("providers.claude.accounts", "[[providers.claude.accounts]]"),
        ("providers.claude", "[providers.claude]"),
        ("providers", "[providers.claude]"),
        ("supervisor", "[supervisor]"),
        ("repos", None),
    ],
)
def test_every_table_and_array_prints_as_toml_that_loads(
    load: Load, key: str, first_line: str | None
) -> None:
    text = TEXT + '\n[[repos]]\nname = "a"\npath = "/a"\n\n[[repos]]\nname = "b"\npath = "/b"\n'
    result = get_value(load(text), key)
    assert result.toml is not None
    if first_line is not None:
        assert result.toml.splitlines()[0] == first_line
    # The fragment is TOML meaning the value at that key.
    node: Any = tomllib.loads(result.toml)
    for part in parse_key_path(key):
        node = node[part]
    assert node == result.value


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (
            "providers.claude.concurency",
            "providers.claude.concurency: unknown key; did you mean 'concurrency'?",
        ),
        ("supervisr.state_dir", "supervisr: unknown key; did you mean 'supervisor'?"),
        ("providers.codex.exec", "providers.codex: not in "),
        ("providers.claud.exec", "providers.claud: not in "),
        (
            "providers.claude.accounts[3].name",
            "providers.claude.accounts has no element [3]; it has 1 ([0])",
        ),
        ("providers.claude.env.NOPE", "providers.claude.env.NOPE: not set (and no default) in "),
        ("api.listen.port", "api.listen has no part 'port'"),
        ("a..b", "malformed key 'a..b' at character 3"),
        (
            "repos[x]",
            "malformed key 'repos[x]' at character 6; a key is names joined by '.' with an"
            " element's index in brackets, e.g. repos[0].path",
        ),
    ],
)
def test_unknown_keys_are_errors(load: Load, key: str, message: str) -> None:
    with pytest.raises(ConfigUsageError) as caught:
        get_value(load(TEXT), key)
    assert str(caught.value).startswith(message)
    if key.startswith("providers.claud."):
        assert str(caught.value).endswith("did you mean 'claude'?")


@pytest.mark.parametrize("key", ["repos", "providers.claude.accounts"])
def test_an_array_of_tables_the_file_leaves_out_is_empty(load: Load, key: str) -> None:
    text = TEXT.partition("[[providers.claude.accounts]]")[0]
    result = get_value(load(text), key)
    assert (result.toml, result.value, str(result.origin)) == ("[]", [], "default")
