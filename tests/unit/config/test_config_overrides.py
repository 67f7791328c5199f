# ruff: noqa: E501  -- expected error lines are kept whole, as users see them.
"""``--set KEY=VALUE``: parsed like the file, located at the argument."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from herdsman.config import LoadedConfig, Origin
from herdsman.config.overrides import parse_value_text

Load = Callable[..., LoadedConfig]
Errors = Callable[..., list[str]]
MINIMAL = '[providers.claude]\nexec = ["claude", "-p"]\n'


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3", 3),
        ('"15m"', "15m"),
        ("15m", "15m"),
        ('["claude", "-p"]', ["claude", "-p"]),
        ("true", True),
        ("127.0.0.1:7878", "127.0.0.1:7878"),
        ("two words", "two words"),
        ("", ""),
        ('{ A = "1" }', {"A": "1"}),
        ("1.5", 1.5),
    ],
)
def test_values_are_toml_or_else_a_bare_string(text: str, value: Any) -> None:
    assert parse_value_text(text) == value


def test_overrides_replace_file_values_and_are_marked(load: Load) -> None:
    loaded = load(
        MINIMAL + "concurrency = 2\n",
        [
            "providers.claude.concurrency=4",
            "providers.claude.timeout=15m",
            "supervisor.max_concurrency=8",
        ],
    )
    assert loaded.config.providers["claude"].concurrency == 4
    assert loaded.config.supervisor.max_concurrency == 8
    assert loaded.origins["providers.claude.concurrency"] == Origin("override")
    assert str(loaded.origins["providers.claude.timeout"]) == "--set"


def test_override_can_define_a_whole_provider(load: Load) -> None:
    loaded = load(MINIMAL, ['providers.codex.exec=["codex", "exec"]', 'providers.codex.env.X="1"'])
    assert loaded.config.providers["codex"].exec == ("codex", "exec")
    assert loaded.config.providers["codex"].env == {"X": "1"}


def test_override_paths_resolve_against_the_config_folder(load: Load, config_path: Path) -> None:
    loaded = load(MINIMAL, ["supervisor.state_dir=rel/state"])
    assert loaded.config.supervisor.state_dir == config_path.parent / "rel/state"


def test_override_into_an_array_of_tables(load: Load) -> None:
    text = MINIMAL + '[[providers.claude.accounts]]\nname = "a"\n'
    loaded = load(text, ["providers.claude.accounts[0].concurrency=3"])
    assert loaded.config.providers["claude"].accounts[0].concurrency == 3


def test_override_errors_are_located_at_the_argument(errors: Errors) -> None:
    assert errors(
        MINIMAL + "concurrency = 0\n",
        [
            "providers.claude.exec=claude",
            "retention.sweep_interval=0",
            "providers.new.concurrency=2",
            "nonsense",
            "providers.claude.concurency=2",
            "a..b=1",
            "repos[3].name=x",
            "providers.claude.exec.x=1",
            "providers.claud.concurrency=3",
        ],
    ) == [
        "supervisor.toml:3:15: providers.claude.concurrency: must be a whole number from 1 to 64, got 0",
        "--set providers.claude.exec=claude: providers.claude.exec: must be a non-empty list of strings, "
        'e.g. ["claude", "-p"], got "claude"',
        '--set retention.sweep_interval=0: retention.sweep_interval: must be a duration such as "90s", '
        '"15m", "1h30m", "14d" (greater than zero), got 0',
        "--set providers.new.concurrency=2: providers.new: not in the configuration; the names "
        "there are: claude (to add a new one, set providers.new.exec first)",
        "--set nonsense: must be KEY=VALUE, e.g. providers.claude.concurrency=2",
        "--set providers.claude.concurency=2: providers.claude.concurency: unknown key; "
        "did you mean 'concurrency'?",
        "--set a..b=1: malformed key 'a..b' at character 3; a key is names joined by '.' with"
        " an element's index in brackets, e.g. repos[0].path",
        "--set repos[3].name=x: repos has no element [3]; it has none",
        "--set providers.claude.exec.x=1: providers.claude.exec is a list; it has no part 'x'",
        "--set providers.claud.concurrency=3: providers.claud: not in the configuration; did you "
        "mean 'claude'? (to add a new one, set providers.claud.exec first)",
    ]


def test_override_that_fixes_a_file_error_makes_it_valid(load: Load) -> None:
    loaded = load(MINIMAL + "concurrency = 0\n", ["providers.claude.concurrency=1"])
    assert loaded.config.providers["claude"].concurrency == 1


@pytest.mark.parametrize(
    "text",
    [
        'store.url="postgresql://herdsman:hunter2@db/herdsman"',
        "store.url=postgresql://herdsman:hunter2@db/herdsman",
        "store.url=postgresql://db/herdsman?pass%77ord=hunter2",
    ],
)
def test_an_override_is_echoed_without_its_password(errors: Errors, text: str) -> None:
    (line,) = errors(MINIMAL, [text])
    assert "must not contain a password" in line
    assert line.startswith("--set store.url=")
    assert "hunter2" not in line
