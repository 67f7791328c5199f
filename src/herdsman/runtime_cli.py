"""The runtime subcommands: ``run`` (the supervisor) and the API clients.

``submit``, ``status``, ``runs``, ``cancel``, ``logs`` and ``reload`` talk to
a running supervisor over its HTTP API, found through the same configuration
file (``api.listen`` and the token file in ``state_dir``). This module holds
``run`` and registers every command in the order ``herdsman --help`` lists
them; each command group lives in a module of its own: runs_cli.py
(``submit``, ``runs``, ``cancel``), status_cli.py (``status``,
``accounts``, ``worktrees``), logs_cli.py, reload_cli.py, and what they
share in cli_common.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from herdsman.cli_common import CommandError, OptionsFactory, guard
from herdsman.config import load_config
from herdsman.logs_cli import add_logs_command
from herdsman.reload_cli import add_reload_command
from herdsman.runs_cli import add_cancel_command, add_runs_command, add_submit_command
from herdsman.status_cli import add_accounts_command, add_status_command, add_worktrees_command

# -- run ----------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    from herdsman.config import environment_warnings  # noqa: PLC0415
    from herdsman.runtime.lockfile import StateDirLocked  # noqa: PLC0415
    from herdsman.runtime.main import StartFailed, run_supervisor  # noqa: PLC0415
    from herdsman.runtime.reload import ConfigSource  # noqa: PLC0415

    loaded = load_config(args.config, args.overrides)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for warning in environment_warnings(loaded):
        logging.getLogger("herdsman").warning("%s", warning)
    source = ConfigSource(loaded.path, tuple(args.overrides))
    try:
        return run_supervisor(loaded.config, source=source, loaded=loaded)
    except (StateDirLocked, StartFailed) as error:
        raise CommandError(str(error)) from None
    except OSError as error:  # the state directory cannot be created or locked
        raise CommandError(f"cannot start: {error}") from None


def add_runtime_commands(commands: Any, config_options: OptionsFactory) -> None:
    """Register ``run``, ``submit``, ``status``, ``runs``, ``cancel``, ``logs``, ``reload``."""
    run = commands.add_parser(
        "run",
        parents=[config_options()],
        help="start the supervisor (the main job)",
        description="Start the supervisor on the configuration file and run until stopped:"
        " the first SIGINT or SIGTERM drains (running runs may finish), a second one stops"
        " them; SIGHUP or an edit of the file reloads it. See docs/operations.md.",
    )
    run.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="how much to log on stderr (default info)",
    )
    run.set_defaults(handler=guard(_run))

    add_submit_command(commands, config_options)
    add_status_command(commands, config_options)
    add_accounts_command(commands, config_options)
    add_runs_command(commands, config_options)
    add_cancel_command(commands, config_options)
    add_logs_command(commands, config_options)
    add_worktrees_command(commands, config_options)
    add_reload_command(commands, config_options)
