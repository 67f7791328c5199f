"""``herdsman logs``: a run's output, read from this machine's state directory."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from herdsman.cli_common import (
    TERMINAL,
    CommandError,
    OptionsFactory,
    UsageError,
    client_for,
    guard,
    load,
)
from herdsman.config import ConfigError
from herdsman.runtime.api.client import ApiError, ApiUnavailable
from herdsman.runtime.ids import run_id_problem

if TYPE_CHECKING:
    from herdsman.runtime.runner.protocols import LogText


def _logs(args: argparse.Namespace) -> int:
    if problem := run_id_problem(args.run_id):
        raise UsageError(f"run id {problem}")
    from herdsman.runtime.runner.protocols import LogText  # noqa: PLC0415

    config = load(args)
    state_dir = config.supervisor.state_dir
    path = state_dir / "logs" / f"{args.run_id}.log"
    text = None if args.raw else LogText()
    if not args.follow:
        if not path.exists() and not path.is_symlink():
            raise CommandError(_missing_log(args, path))
        _copy_log(state_dir, path, 0, text)
        _finish_log(text)
        return 0
    with client_for(args) as client:
        offset = 0
        while True:
            _, run = client.request("GET", f"/v1/runs/{args.run_id}")
            offset = _copy_log(state_dir, path, offset, text, missing_ok=True)
            if run["status"] in TERMINAL:
                _copy_log(state_dir, path, offset, text, missing_ok=True)
                _finish_log(text)
                if not path.exists():
                    raise CommandError(_ended_without_log(args.run_id, run["status"], path))
                return 0
            time.sleep(0.5)


def _ended_without_log(run_id: str, status: str, path: Path) -> str:
    return (
        f"no log at {path}: run {run_id} ended as {status} without a log on this machine"
        " (a run cancelled before it started has none; in a fleet, a run another member"
        " ran has its log on that member's machine)"
    )


def _missing_log(args: argparse.Namespace, path: Path) -> str:
    """Why a run has no log here, as far as the running supervisor can say (queued, say)."""
    try:
        with client_for(args) as client:
            _, run = client.request("GET", f"/v1/runs/{args.run_id}")
    except (ApiUnavailable, ApiError, CommandError, ConfigError):
        # No supervisor to ask, or it knows no such run: the folder is all there is.
        return f"no log at {path}: no run with this id has started on this supervisor"
    status = run["status"]
    if status in TERMINAL:
        return _ended_without_log(args.run_id, status, path)
    return (
        f"no log at {path} yet: run {args.run_id} is {status}; `herdsman logs {args.run_id}"
        " --follow` waits for it to start and follows it"
    )


def _copy_log(
    state_dir: Path, path: Path, offset: int, text: LogText | None, *, missing_ok: bool = False
) -> int:
    """Print the log from ``offset`` on: as recorded, or through ``text`` (a ``LogText``)."""
    from herdsman.runtime.state_paths import LinkRefused, open_below  # noqa: PLC0415

    try:
        # Never through a link (an agent's, to /dev/zero say): a log is a
        # regular file in <state_dir>/logs.
        with os.fdopen(open_below(state_dir, path, os.O_RDONLY), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise CommandError(f"cannot read the log {path}: not a regular file")
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        if missing_ok:
            return offset
        raise CommandError(
            f"no log at {path}: no run with this id has started on this supervisor"
        ) from None
    except LinkRefused as error:
        raise CommandError(str(error)) from None
    except OSError as error:
        raise CommandError(f"cannot read the log {path}: {error.strerror}") from None
    if text is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        sys.stdout.write(text.feed(data))
        sys.stdout.flush()
    return offset + len(data)


def _finish_log(text: LogText | None) -> None:
    if text is not None:
        sys.stdout.write(text.finish())
        sys.stdout.flush()


def add_logs_command(commands: Any, config_options: OptionsFactory) -> None:
    logs = commands.add_parser(
        "logs",
        parents=[config_options()],
        help="print a run's output",
        description="Print a run's output log, read from this machine's state directory.",
    )
    logs.add_argument(
        "run_id", metavar="RUN_ID", help="the id of the run (as submit or runs printed it)"
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    logs.add_argument(
        "--raw",
        action="store_true",
        help="print the output as recorded (claude and codex streams are JSON lines)",
    )
    logs.set_defaults(handler=guard(_logs))
