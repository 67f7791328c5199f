"""What every command of the ``herdsman`` CLI that reaches a supervisor shares.

The errors a command raises for a one-line message (:class:`CommandError`,
:class:`UsageError`) and :func:`guard`, which prints them; reading the
configuration, even while the file is invalid, to find the running
supervisor's API (:func:`client_for`); and the JSON and time texts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from herdsman.config import Config, ConfigError, load_config
from herdsman.runtime.api.client import ApiClient, ApiError, ApiUnavailable

OptionsFactory = Callable[..., argparse.ArgumentParser]
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "lost", "skipped", "usage_limited"}


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


class UsageError(CommandError):
    """Flags that do not go together, or a missing argument: one line, exit status 2."""


def load(args: argparse.Namespace) -> Config:
    """The configuration ``args`` name, with their overrides."""
    return load_config(args.config, args.overrides).config


def _located(args: argparse.Namespace) -> Config:
    """The config to find the supervisor with, even while the file is invalid.

    A supervisor keeps running its last valid configuration when an edit is
    rejected, and ``status`` and ``reload`` must still reach it then. So when
    the file does not validate, only what locates the API (the ``[supervisor]``
    and ``[api]`` tables, as written) is checked; if that fails too, the
    file's own errors are reported.
    """
    try:
        return load(args)
    except ConfigError as error:
        try:
            return _locating_config(args)
        except ConfigError:
            raise error from None


def _locating_config(args: argparse.Namespace) -> Config:
    import tomllib  # noqa: PLC0415

    import tomlkit  # noqa: PLC0415

    from herdsman.config import find_config_file, load_config_text  # noqa: PLC0415
    from herdsman.config.load import read_config_text  # noqa: PLC0415

    path = find_config_file(args.config, os.environ)
    try:
        raw = tomllib.loads(read_config_text(path))
    except tomllib.TOMLDecodeError:
        raise ConfigError([]) from None
    located: dict[str, Any] = {"providers": {"locating": {"exec": ["locating"]}}}
    for table in ("supervisor", "api"):
        if isinstance(raw.get(table), dict):
            located[table] = raw[table]
    return load_config_text(tomlkit.dumps(located), path, args.overrides).config


def client_for(args: argparse.Namespace) -> ApiClient:
    """A client for the supervisor running on the file ``args`` name.

    The pointer that supervisor left comes first: the file may name another
    address by now (an edit that waits for a restart, or an invalid one).
    """
    from herdsman.config import find_config_file  # noqa: PLC0415

    try:
        path = find_config_file(args.config, os.environ)
    except ConfigError:
        path = None
    if path is not None:
        client = pointed_client(path)
        if client is not None:
            return client
    return client_of(_located(args))


def pointed_client(config_file: Path) -> ApiClient | None:
    """A client for the supervisor whose pointer file the configuration file has, if any."""
    from herdsman.runtime.pointer import read_pointer  # noqa: PLC0415

    pointer = read_pointer(config_file)
    if pointer is None:
        return None
    return ApiClient.with_token_file(pointer.url, pointer.token_file)


def client_of(config: Config) -> ApiClient:
    """A client for the supervisor that ``config`` locates (its API and token file)."""
    from herdsman.runtime.main import token_path  # noqa: PLC0415 - keeps `check` light

    return ApiClient.for_config(config, token_path(config))


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON."""
    print(json.dumps(value, indent=2, ensure_ascii=False))


def guard(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``handler`` with its errors printed as one line: exit status 2 for usage, else 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ConfigError as error:
            for problem in error.problems:
                print(problem, file=sys.stderr)
        except ApiUnavailable as error:
            print(f"herdsman: {error}", file=sys.stderr)
        except ApiError as error:
            print(f"herdsman: {error.message} (HTTP {error.status})", file=sys.stderr)
        except UsageError as error:
            print(f"herdsman {args.command}: {error}", file=sys.stderr)
            return 2
        except CommandError as error:
            print(f"herdsman: {error}", file=sys.stderr)
        return 1

    return run


def local_time_text(when: float) -> str:
    """``when`` (unix seconds) as local time, to the second (ISO 8601)."""
    return dt.datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")
