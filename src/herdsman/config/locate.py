"""Find ``supervisor.toml``: ``-c FILE``, ``$HERDSMAN_CONFIG``, ``./``, then XDG config."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from herdsman.config.problems import ConfigError, ConfigProblem, Location

__all__ = ["CONFIG_NAME", "candidate_paths", "find_config_file"]

CONFIG_NAME = "supervisor.toml"


def candidate_paths(environ: Mapping[str, str], cwd: Path) -> list[Path]:
    """The implicit places looked at, in order, when no file is named."""
    xdg = environ.get("XDG_CONFIG_HOME", "")
    config_home = Path(xdg) if xdg and os.path.isabs(xdg) else Path("~/.config").expanduser()
    local = Path(CONFIG_NAME) if cwd == Path.cwd() else cwd / CONFIG_NAME
    return [local, config_home / "herdsman" / CONFIG_NAME]


def find_config_file(
    explicit: Path | None, environ: Mapping[str, str], cwd: Path | None = None
) -> Path:
    """The config file to use.

    An explicitly named file (``-c`` or ``$HERDSMAN_CONFIG``) is returned even if
    it does not exist, so reading it reports the precise error rather than
    silently falling back to another file. Otherwise the first existing
    candidate wins; if none exists, :class:`ConfigError` lists every place
    looked at.
    """
    if explicit is not None:
        return explicit
    if environ.get("HERDSMAN_CONFIG"):
        return Path(environ["HERDSMAN_CONFIG"])
    candidates = candidate_paths(environ, cwd or Path.cwd())
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(candidate) for candidate in candidates)
    raise ConfigError(
        [
            ConfigProblem(
                Location(""),
                "",
                f"no configuration file found (looked at -c FILE, $HERDSMAN_CONFIG, {looked}); "
                "pass -c FILE or copy supervisor.toml.example to one of those places",
            )
        ]
    )
