"""Helpers for the configuration tests, whose fixtures conftest re-exports.

A module, not the conftest itself: every test folder's conftest has the one
module name ``conftest``, so a type checker can see only one of them; the
others only re-export.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from herdsman.config import ConfigError, LoadedConfig, load_config_text

Load = Callable[..., LoadedConfig]
Errors = Callable[..., list[str]]


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    """Where the file under test pretends to live (names it in messages)."""
    return tmp_path / "supervisor.toml"


@pytest.fixture
def load(config_path: Path) -> Load:
    """Load TOML text as ``supervisor.toml`` in a temporary folder, no environment."""

    def run(
        text: str, overrides: Sequence[str] = (), environ: dict[str, str] | None = None
    ) -> LoadedConfig:
        return load_config_text(text, config_path, overrides, environ=environ or {})

    return run


@pytest.fixture
def errors(config_path: Path) -> Errors:
    """The error lines for TOML text that must be invalid, with the folder stripped."""

    def run(text: str, overrides: Sequence[str] = ()) -> list[str]:
        with pytest.raises(ConfigError) as caught:
            load_config_text(text, Path("supervisor.toml"), overrides, environ={})
        return [str(problem) for problem in caught.value.problems]

    return run
