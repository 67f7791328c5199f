"""supervisor.toml.example and docs/configuration.md stay complete and valid."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from herdsman.config import Config, environment_warnings, load_config
from herdsman.config.kinds import ArrayOfTables, NamedTables, Table
from herdsman.executables import scripts_dir

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "supervisor.toml.example"
REFERENCE = ROOT / "docs" / "configuration.md"


def _documented_keys(cls: type = Config, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for field in attrs.fields(cls):
        kind = field.metadata["kind"]
        key = f"{prefix}{field.name}"
        if isinstance(kind, Table):
            keys += _documented_keys(kind.cls, f"{key}.")
        elif isinstance(kind, NamedTables):
            keys += _documented_keys(kind.item.cls, f"{key}.NAME.")
        elif isinstance(kind, ArrayOfTables):
            keys += _documented_keys(kind.item.cls, f"{key}[].")
        else:
            keys.append(key)
    return keys


ALL_KEYS = _documented_keys()


def test_the_example_loads_with_only_path_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    loaded = load_config(EXAMPLE, environ={})
    assert loaded.config.providers["claude"].exec[0] == "claude"
    assert loaded.config.providers["codex"].protocol == "codex"
    # The demo agent is found beside herdsman itself, whatever PATH says.
    assert loaded.config.providers["demo"].exec[0] == "herdsman-demo-agent"
    assert loaded.config.repos[0].path == ROOT
    warnings = environment_warnings(loaded)
    assert [re.sub(r"^.*?: ", "", w, count=1) for w in warnings] == [
        f"providers.claude.exec: 'claude' was not found on PATH nor in {scripts_dir()}",
        f"providers.codex.exec: 'codex' was not found on PATH nor in {scripts_dir()}",
    ]


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_key_appears_in_the_example(key: str) -> None:
    name = key.rpartition(".")[2]
    assert re.search(rf"^#? ?{re.escape(name)} = ", EXAMPLE.read_text(), re.MULTILINE), key


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_key_is_in_the_reference(key: str) -> None:
    assert f"`{key}`" in REFERENCE.read_text(), key
