"""``herdsman reload``, and what a reload changed as the CLI prints it.

``config set`` reloads a running supervisor too (:func:`reload_running`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from herdsman.cli_common import (
    OptionsFactory,
    client_for,
    client_of,
    guard,
    local_time_text,
    pointed_client,
    print_json,
)
from herdsman.config import Config, ConfigError
from herdsman.runtime.api.client import ApiError, ApiUnavailable


def _reload(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        _, body = client.request("POST", "/v1/reload", timeout=120, answers=(422,))
    if args.json:
        print_json(body)
    elif body.get("repeat"):
        _print_repeated_reload(body, _config_name(args))
    else:
        print_reload(body)
    return 0 if body["ok"] else 1


def _config_name(args: argparse.Namespace) -> str:
    """The configuration file's name, for a message (``the file`` if it cannot be found)."""
    from herdsman.config import find_config_file  # noqa: PLC0415

    try:
        path = find_config_file(args.config, os.environ)
    except ConfigError:
        path = None
    return "the file" if path is None else path.name


def _print_repeated_reload(body: Mapping[str, Any], name: str) -> None:
    """``herdsman reload`` of a file an earlier reload already read: nothing was done now.

    That reload's changes are not listed again: they would read as made now.
    """
    when = dt.datetime.fromtimestamp(body["at"]).astimezone().strftime("%H:%M:%S")
    since = f"{name} is unchanged since the reload at {when}"
    if not body["ok"]:
        print(
            f"{since}, which was rejected (generation {body['generation']} stays in force):",
            file=sys.stderr,
        )
        for error in body["errors"]:
            print(f"  {error}", file=sys.stderr)
        return
    changes = body["changes"]
    said = ["applied"] if any(change["applied"] for change in changes) else []
    if waiting := [change["key"] for change in changes if not change["applied"]]:
        said.append(
            f"{', '.join(waiting)} {'waits' if len(waiting) == 1 else 'wait'} for a restart"
        )
    what = "; ".join(said) or "no changes"
    print(
        f"{since} ({what}, generation {body['generation']}); nothing new to apply,"
        " but any account that needed a login takes runs again"
    )


def reload_running(config: Config, config_file: Path) -> int:
    """Reload the supervisor running on ``config_file`` (after ``config set``).

    Found by the pointer it left, else at the address ``config`` gives.
    """
    try:
        with pointed_client(config_file) or client_of(config) as client:
            _, body = client.request("POST", "/v1/reload", timeout=120, answers=(422,))
    except ApiUnavailable:
        print("no supervisor is running on this file; the change applies when one starts")
        return 0
    except ApiError as error:
        print(f"herdsman: the running supervisor did not reload: {error.message}", file=sys.stderr)
        return 1
    print_reload(body, "the running supervisor reloaded the file:")
    return 0 if body["ok"] else 1


def print_reload(body: Mapping[str, Any], header: str | None = None) -> None:
    """A reload's result, a change a line (``herdsman reload``, ``config set``).

    A file already reloaded (by the file watcher, a SIGHUP) is not reloaded
    again: the answer is that earlier reload, and says so. A rejected reload
    is one report on stderr, header included; an applied one goes to stdout.
    """
    out = sys.stdout if body["ok"] else sys.stderr
    if header is not None:
        print(header, file=out)
    if body.get("repeat"):
        when = local_time_text(body["at"])
        print(f"the file is unchanged since it was reloaded ({body['trigger']}, {when}):", file=out)
    if not body["ok"]:
        print(
            f"reload rejected; nothing changed (generation {body['generation']} stays in force):",
            file=out,
        )
        for error in body["errors"]:
            print(f"  {error}", file=out)
        return
    if not body["changes"]:
        print(f"no changes: the file is already in force (generation {body['generation']})")
        return
    from herdsman.runtime.reload import change_line  # noqa: PLC0415

    for change in body["changes"]:
        kind, old, new = change["change"], change["old"], change["new"]
        print(f"  {change_line(change['key'], kind, old, new, change['applied'])}")
    print(f"generation {body['generation']}")


def add_reload_command(commands: Any, config_options: OptionsFactory) -> None:
    """Register ``reload``."""
    reload = commands.add_parser(
        "reload",
        parents=[config_options(with_overrides=False)],
        help="reload the configuration file and print what changed",
        description="Ask the supervisor running on the configuration file to read it again"
        " and apply all of it or none; print what changed. Exit status 1 if the file was"
        " rejected.",
    )
    reload.add_argument("--json", action="store_true", help="machine-readable output")
    reload.set_defaults(handler=guard(_reload))
