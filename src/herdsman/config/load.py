"""Load a configuration: read, parse, apply ``--set``, validate, structure."""

from __future__ import annotations

import io
import os
import re
import stat
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

__all__ = [
    "MAX_CONFIG_BYTES",
    "LoadedConfig",
    "load_config",
    "load_config_text",
    "read_config_bytes",
    "read_config_text",
]

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


#: The largest configuration file read: a real one is a few KiB; anything
#: near this is a mistake (a log named by accident), not a configuration.
MAX_CONFIG_BYTES = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(mode: int) -> str | None:
    """What a file of ``mode`` is if it is not a regular file, else None."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_config_bytes(path: Path) -> bytes:
    """The file's bytes; ``ValueError`` saying why it is no file to read, or ``OSError``.

    Only a regular file of at most :data:`MAX_CONFIG_BYTES` is read: a
    directory, a FIFO, a device (``/dev/zero``, read until memory runs out)
    or a huge file is refused, saying which.
    """
    # Looked at before it is opened: opening a FIFO waits for a writer, and
    # opening some devices does something.
    kind = _not_a_file(os.stat(path).st_mode)
    if kind is None:
        # O_NONBLOCK: a FIFO swapped in since the stat must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as file:
            info = os.fstat(fd)
            kind = _not_a_file(info.st_mode)
            if kind is None and info.st_size <= MAX_CONFIG_BYTES:
                data = file.read(MAX_CONFIG_BYTES + 1)  # never more, even if it grows
                if len(data) <= MAX_CONFIG_BYTES:
                    return data
    if kind is not None:
        raise ValueError(f"{kind}, not a regular file; name the configuration file itself")
    raise ValueError(
        f"larger than {MAX_CONFIG_BYTES >> 20} MiB, too large for a configuration file;"
        " is this the right file?"
    )


def read_config_text(path: Path) -> str:
    """The file's text; :class:`ConfigError` (``FILE: cannot read file: ...``) if unreadable.

    What :func:`read_config_bytes` refuses is one such line too.
    """
    try:
        # newline="" keeps CRLF files byte-exact for `config set`.
        data = read_config_bytes(path)
        return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="").read()
    except OSError as error:
        reason = error.strerror or str(error)
    except UnicodeDecodeError as error:
        reason = f"not UTF-8 text ({error.reason} at byte {error.start})"
    except ValueError as error:
        reason = str(error)
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
