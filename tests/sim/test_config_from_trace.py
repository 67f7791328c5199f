"""A trace's configuration is loaded once per process for each distinct configuration.

A plan's engine loads the configuration it simulates again for every
simulation; the second load of the same JSON, in the same working folder
with the same ``HOME``, is the first one's, and anything that differs loads
afresh.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from herdsman.config import LoadedConfig, load_config_text
from herdsman.sim import workload
from herdsman.sim.workload import config_from_trace

CONFIG: dict[str, Any] = {
    "supervisor": {"state_dir": "state", "max_concurrency": 8},
    "providers": {
        "claude": {"exec": ["claude", "-p"], "concurrency": 4, "timeout": None},
        "codex": {"exec": ["codex", "exec", "-"], "concurrency": 2},
    },
}


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The TOML texts config_from_trace loads, with nothing loaded before."""
    texts: list[str] = []

    def counting(text: str, path: Path, overrides: Sequence[str] = (), **kw: Any) -> LoadedConfig:
        texts.append(text)
        return load_config_text(text, path, overrides, **kw)

    workload._loaded.cache_clear()
    monkeypatch.setattr(workload, "load_config_text", counting)
    yield texts
    workload._loaded.cache_clear()  # nothing loaded through the counting stand-in stays


def test_the_same_configuration_is_loaded_once(loads: list[str]) -> None:
    first = config_from_trace(CONFIG, "configuration")
    again = config_from_trace(copy.deepcopy(CONFIG), "configuration")
    assert len(loads) == 1
    assert again == first


def test_each_caller_gets_its_own_warnings(loads: list[str]) -> None:
    first = config_from_trace(CONFIG, "configuration")
    first.warnings.append("noted by one caller")
    assert config_from_trace(CONFIG, "configuration").warnings == []


def test_a_changed_configuration_loads_afresh(loads: list[str]) -> None:
    config = copy.deepcopy(CONFIG)
    assert config_from_trace(config, "c").config.providers["claude"].concurrency == 4
    config["providers"]["claude"]["concurrency"] = 6  # the same dict, changed in place
    assert config_from_trace(config, "c").config.providers["claude"].concurrency == 6
    reordered = {"providers": dict(reversed(config["providers"].items()))}
    assert list(config_from_trace(reordered, "c").config.providers) == ["codex", "claude"]
    config_from_trace(config, "c", ["providers.codex.concurrency=3"])
    config_from_trace(config, "another name")
    assert len(loads) == 5


def test_relative_paths_follow_the_working_folder(
    loads: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert config_from_trace(CONFIG, "c").config.supervisor.state_dir == tmp_path / "a" / "state"
    monkeypatch.chdir(tmp_path / "b")
    assert config_from_trace(CONFIG, "c").config.supervisor.state_dir == tmp_path / "b" / "state"


def test_home_is_read_afresh(
    loads: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {**CONFIG, "supervisor": {"state_dir": "~/state"}}
    monkeypatch.setenv("HOME", str(tmp_path / "one"))
    assert config_from_trace(config, "c").config.supervisor.state_dir == tmp_path / "one" / "state"
    monkeypatch.setenv("HOME", str(tmp_path / "two"))
    assert config_from_trace(config, "c").config.supervisor.state_dir == tmp_path / "two" / "state"
