"""Load a configuration: read, parse, apply ``--set``, validate, structure."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from tomlkit.exceptions import ParseError

from herdsman.config.convert import structure_config
from herdsman.config.keypath import format_key_path
from herdsman.config.kinds import Table
from herdsman.config.locate import find_config_file
from herdsman.config.model import Config
from herdsman.config.overrides import apply_overrides
from herdsman.config.positions import parse_with_positions
from herdsman.config.problems import ConfigError, ConfigProblem, Location, Origin
from herdsman.config.validate import Checker

__all__ = ["LoadedConfig", "load_config", "load_config_text", "read_config_text"]

_PARSE_POSITION = re.compile(r"\s+at line \d+ col \d+$")
_STRICT_POSITION = re.compile(r"\s+\(at line (\d+), column (\d+)\)$")


@attrs.frozen
class LoadedConfig:
    """A valid configuration and what is known about it.

    ``values``, ``toml_values`` and ``origins`` are keyed by key path text
    (``providers.claude.concurrency``) and list every effective setting in model
    order: ``values`` the normalised value, ``toml_values`` its TOML form
    (``None``: not set and no default), ``origins`` where it came from.
    ``warnings`` are facts that do not stop a start (``herdsman check`` fills
    them from :func:`herdsman.config.environment.environment_warnings`).
    """

    config: Config
    path: Path
    text: str
    values: Mapping[str, Any]
    toml_values: Mapping[str, Any]
    origins: Mapping[str, Origin]
    warnings: list[str] = attrs.field(factory=list)


def read_config_text(path: Path) -> str:
    """The file's text; :class:`ConfigError` (``FILE: cannot read file: ...``) if unreadable."""
    try:
        # newline="" keeps CRLF files byte-exact for `config set`.
        with path.open(encoding="utf-8", newline="") as file:
            return file.read()
    except OSError as error:
        reason = error.strerror or str(error)
    except UnicodeDecodeError as error:
        reason = f"not UTF-8 text ({error.reason} at byte {error.start})"
    raise ConfigError([ConfigProblem(Location(str(path)), "", f"cannot read file: {reason}")])


def load_config(
    path: Path | None = None,
    overrides: Sequence[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> LoadedConfig:
    """Find, read and validate the configuration, applying ``overrides`` (``KEY=VALUE``).

    ``path`` ``None`` looks in the usual places (:func:`find_config_file`).
    Raises :class:`ConfigError` listing every problem, in file order.
    """
    environ = os.environ if environ is None else environ
    found = find_config_file(path, environ, cwd)
    return load_config_text(read_config_text(found), found, overrides, environ=environ)


def load_config_text(
    text: str,
    path: Path,
    overrides: Sequence[str] = (),
    *,
    environ: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """Validate ``text`` as if read from ``path`` (which names it in messages and
    anchors relative paths). Raises :class:`ConfigError`."""
    environ = os.environ if environ is None else environ
    source = str(path)
    try:
        document, positions = parse_with_positions(text)
    except ParseError as error:
        message = _PARSE_POSITION.sub("", str(error))
        location = Location.in_file(source, error.line, error.col + 1)  # tomlkit's col is 0-based
        raise ConfigError([ConfigProblem(location, "", f"invalid TOML: {message}")]) from None
    _check_strictly(text, source)
    raw: dict[str, Any] = document.unwrap()
    applied, problems = apply_overrides(raw, overrides)
    checker = Checker(source, positions, path.absolute().parent, environ, applied)
    data = checker.check_table(Table(Config), raw, ())
    problems += checker.problems
    if problems or data is None:
        raise ConfigError(problems)
    return LoadedConfig(
        config=structure_config(data),
        path=path,
        text=text,
        values={format_key_path(key): value for key, value in checker.values.items()},
        toml_values={format_key_path(key): toml for key, toml in checker.toml_values.items()},
        origins={format_key_path(key): origin for key, origin in checker.origins.items()},
    )


def _check_strictly(text: str, source: str) -> None:
    """Refuse what the TOML spec forbids but tomlkit lets through.

    tomlkit accepts a table declared twice when a sub-table stands between the
    two headers (``[a]`` ... ``[a.c]`` ... ``[a]``); the standard library's
    parser follows the spec, so a file ``check`` passes is one every TOML
    reader takes.
    """
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        found = _STRICT_POSITION.search(message)
        location = (
            Location.in_file(source, int(found[1]), int(found[2])) if found else Location(source)
        )
        message = _STRICT_POSITION.sub("", message)
        raise ConfigError([ConfigProblem(location, "", f"invalid TOML: {message}")]) from None
