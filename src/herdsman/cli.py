"""The ``herdsman`` command line: a thin argparse layer over the library.

Each subcommand is a function taking the parsed arguments and returning the
exit status: 0 success, 1 a problem with the configuration or the request,
2 a usage error (argparse's own).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from herdsman import __version__
from herdsman.config import (
    ConfigError,
    ConfigUsageError,
    EditResult,
    add_element,
    environment_warnings,
    get_value,
    load_config,
    load_config_text,
    remove_key,
    set_value,
)
from herdsman.config.locate import find_config_file
from herdsman.config.report import check_json, check_text
from herdsman.reload_cli import reload_running
from herdsman.runtime_cli import add_runtime_commands
from herdsman.sim.cli import add_sim_commands
from herdsman.usage_cli import add_usage_command

__all__ = ["add_command", "main"]

Command = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error said in one line (exit status 2, as argparse's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


class _RefusedSet(argparse.Action):
    """``--set`` on a command that reads no settings of its own: refused, not ignored.

    The clients of a running supervisor (``status``, ``worktrees sweep``...)
    act on the settings it runs on; a ``--set`` there would change nothing.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            "--set is not taken here: it changes a setting only for a command that reads the"
            " file itself (run, check, config get, logs, sim); for the running supervisor,"
            " change the file: herdsman config set KEY VALUE"
        )


def _config_options(with_overrides: bool = True) -> _Parser:
    options = _Parser(add_help=False)
    options.add_argument(
        "-c",
        "--config",
        type=Path,
        metavar="FILE",
        help="configuration file (default: $HERDSMAN_CONFIG, ./supervisor.toml, "
        "$XDG_CONFIG_HOME/herdsman/supervisor.toml)",
    )
    if with_overrides:
        options.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a setting for this command (repeatable); VALUE is TOML or a bare word",
        )
    else:
        options.add_argument(
            "--set", dest="overrides", action=_RefusedSet, default=[], help=argparse.SUPPRESS
        )
    return options


def _print_errors(error: ConfigError) -> int:
    for problem in error.problems:
        print(problem, file=sys.stderr)
    # A key path that names nothing is a mistake in the command, not the file.
    return 2 if isinstance(error, ConfigUsageError) else 1


def _check(args: argparse.Namespace) -> int:
    try:
        loaded = load_config(args.config, args.overrides)
    except ConfigError as error:
        if args.json:
            print(json.dumps(check_json(None, error.problems), indent=2))
            return 1
        return _print_errors(error)
    loaded.warnings.extend(environment_warnings(loaded))
    if args.json:
        print(json.dumps(check_json(loaded), indent=2))
    else:
        sys.stdout.write(check_text(loaded))
    return 0


def _config_get(args: argparse.Namespace) -> int:
    try:
        loaded = load_config(args.config, args.overrides)
        result = get_value(loaded, args.key)
    except ConfigError as error:
        return _print_errors(error)
    if args.json:
        origins = {key: str(origin) for key, origin in result.origins.items()}
        print(json.dumps({"key": result.key, "value": result.value, "origins": origins}, indent=2))
        return 0
    if result.toml is None:
        print(f"{result.key}: not set in {loaded.path} and has no default", file=sys.stderr)
        return 0
    if result.origin.kind == "default":
        print(f"{result.key}: not set in {loaded.path}; this is the default", file=sys.stderr)
    print(result.toml)
    return 0


def after_config_write(result: EditResult) -> int:
    """Ask a supervisor running on the file to reload it; ``config set``'s exit status.

    The supervisor is found at the address of the file as it was before the
    edit: that is where a running one listens, even if the edit moved it. An
    edit that leaves the file as it was asks nothing: a running supervisor
    would answer with its last reload, as if that were this edit's.
    """
    if result.new_text == result.old_text:
        print(f"{result.path.name} already said so; nothing changed, nothing to reload")
        return 0
    try:
        before = load_config_text(result.old_text, result.path).config
    except ConfigError:  # the edit repaired the file: find the supervisor with the new one
        before = result.loaded.config
    return reload_running(before, result.path)


def _print_edit_warnings(result: EditResult) -> None:
    """What ``herdsman check`` would warn about the edited key (a repo path that is no folder).

    The edit is written: it is valid. But a typo in a path or a command is
    better said now than found in a run's notes later.
    """
    edited = result.key
    for warning in environment_warnings(result.loaded):
        parts = warning.split(": ", 2)
        key = parts[1] if len(parts) == 3 else ""
        if key == edited or key.startswith((f"{edited}.", f"{edited}[")):
            print(f"warning: {warning}", file=sys.stderr)


def _config_set(args: argparse.Namespace) -> int:
    try:
        path = find_config_file(args.config, os.environ)
        result = set_value(path, args.key, args.value)
        written = get_value(result.loaded, args.key)
    except ConfigError as error:
        return _print_errors(error)
    print(f"{written.key} = {written.toml}  ({path})")
    _print_edit_warnings(result)
    if not args.reload:
        return 0
    return after_config_write(result)


def _config_add(args: argparse.Namespace) -> int:
    try:
        path = find_config_file(args.config, os.environ)
        result = add_element(path, args.key, args.fields)
    except ConfigError as error:
        return _print_errors(error)
    print(f"added {result.key}  ({path})")
    _print_edit_warnings(result)
    return after_config_write(result) if args.reload else 0


def _config_remove(args: argparse.Namespace) -> int:
    try:
        path = find_config_file(args.config, os.environ)
        result = remove_key(path, args.key)
    except ConfigError as error:
        return _print_errors(error)
    print(f"removed {result.key}  ({path})")
    return after_config_write(result) if args.reload else 0


def add_command(
    commands: Any,
    name: str,
    handler: Command | None,
    summary: str,
    description: str,
    *,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> argparse.ArgumentParser:
    """Register the subcommand ``name`` under ``commands`` (an ``add_subparsers`` result).

    ``summary`` is its line in the parent's help, ``description`` the head
    of its own; ``handler`` runs it (None: a group whose actions run).
    """
    parser: argparse.ArgumentParser = commands.add_parser(
        name, parents=list(parents), help=summary, description=description
    )
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser


def _edit_parser(
    commands: Any,
    name: str,
    handler: Command,
    summary: str,
    description: str,
) -> argparse.ArgumentParser:
    """A ``config`` subcommand that edits the file, then asks a running supervisor to reload."""
    parser = add_command(
        commands,
        name,
        handler,
        summary,
        description,
        parents=[_config_options(with_overrides=False)],
    )
    parser.add_argument(
        "--no-reload",
        dest="reload",
        action="store_false",
        help="do not ask a running supervisor to reload (it still applies the edit"
        " when it notices the file changed)",
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; later subcommands (run, status, reload, sim) add to it."""
    parser = _Parser(prog="herdsman", description="A supervisor for coding-agent runs.")
    parser.add_argument("--version", action="version", version=f"herdsman {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    check = add_command(
        commands,
        "check",
        _check,
        "validate the configuration and show the effective settings",
        "Validate the configuration file and print every effective setting and where it came"
        " from (the file, a --set, or the default). Exit status 1 when the file is invalid,"
        " with every error on its own line.",
        parents=[_config_options()],
    )
    check.add_argument("--json", action="store_true", help="machine-readable output")

    config = add_command(
        commands,
        "config",
        None,
        "read or edit the configuration file",
        "Read a setting of the configuration file, or edit one in place.",
    )
    config_commands = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    get = add_command(
        config_commands,
        "get",
        _config_get,
        "print the effective value of KEY as TOML",
        "Print the effective value of KEY as TOML: as the file sets it, else its default."
        " A table or an array of tables prints as the TOML that writes it.",
        parents=[_config_options()],
    )
    get.add_argument(
        "key", metavar="KEY", help="a key path, e.g. providers.claude.concurrency, repos[0], repos"
    )
    get.add_argument(
        "--json", action="store_true", help="print {key, value, origins} as JSON instead"
    )
    set_ = _edit_parser(
        config_commands,
        "set",
        _config_set,
        "set KEY to VALUE in the file, keeping its layout",
        "Set KEY to VALUE in the configuration file, keeping its comments and layout (a new"
        " key goes into its own table, a new table after the last of its kind); the whole"
        " file is validated first. A supervisor running on the file is asked to reload it.",
    )
    set_.add_argument("key", metavar="KEY", help="a key path, e.g. 'repos[0].path'")
    set_.add_argument(
        "value", metavar="VALUE", help='a TOML value (3, "15m", ["a", "b"]) or a bare word'
    )
    add = _edit_parser(
        config_commands,
        "add",
        _config_add,
        "append an element to an array of tables (a repo, an account)",
        "Append an element to the array of tables KEY, after its last element,"
        " e.g. `config add repos name=app path=~/src/app`.",
    )
    add.add_argument(
        "key", metavar="KEY", help="an array of tables: repos or providers.NAME.accounts"
    )
    add.add_argument(
        "fields",
        metavar="FIELD=VALUE",
        nargs="+",
        help="a field of the new element; VALUE as for config set (env.NAME=x for a table)",
    )
    remove = _edit_parser(
        config_commands,
        "remove",
        _config_remove,
        "remove a setting, a table or an element of an array of tables",
        "Remove KEY from the file: a setting (it takes its default again), a table"
        " (providers.codex), an element ('repos[1]'; later elements move up) or a whole array.",
    )
    remove.add_argument("key", metavar="KEY", help="a key path, e.g. 'repos[1]'")

    add_runtime_commands(commands, _config_options)
    add_usage_command(commands, _config_options)
    add_sim_commands(commands)
    return parser


def _option_before_command(argv: Sequence[str]) -> str | None:
    """The usage error for ``herdsman -c FILE status``: the commands' options go after them.

    argparse would read FILE as the command's name and answer "invalid choice".
    """
    if not argv:
        return None
    first = argv[0]
    if first in ("-c", "--config", "--set") and len(argv) > 1:
        option, rest = list(argv[:2]), list(argv[2:])
    elif first.startswith(("--config=", "--set=")) or (
        first.startswith("-c") and not first.startswith("--") and len(first) > 2
    ):
        option, rest = [first], list(argv[1:])
    else:
        return None
    return (
        f"herdsman: {shlex.join(option)} is an option of the command: put it after the"
        f" command's name, e.g. `herdsman {shlex.join(rest + option)}`"
        " (see `herdsman COMMAND --help`)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    if problem := _option_before_command(sys.argv[1:] if argv is None else argv):
        print(problem, file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    handler: Command = args.handler
    try:
        return handler(args)
    except BrokenPipeError:
        # The reader went away (`herdsman check | head`); say nothing more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
