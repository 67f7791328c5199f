"""The run commands of the CLI: ``submit``, ``runs`` and ``cancel``.

Each talks to the running supervisor over its HTTP API: ``submit`` (and
its ``--wait``), ``runs`` (the list, or one run in full) and ``cancel``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from herdsman.attempt_text import attempt_line
from herdsman.cli_common import (
    TERMINAL,
    CommandError,
    OptionsFactory,
    UsageError,
    client_for,
    guard,
    local_time_text,
    print_json,
)
from herdsman.cli_tables import Column, duration_text, local_time, print_table
from herdsman.runtime.api.client import ApiClient, ApiError, ApiUnavailable
from herdsman.spend_text import spend_lines, spent_cell


def _submit(args: argparse.Namespace) -> int:
    if args.wait_timeout is not None and not args.wait:
        raise UsageError("--wait-timeout goes with --wait; add --wait or leave it out")
    if args.prompt is None or args.prompt == "-":
        if sys.stdin.isatty():
            raise UsageError("give the prompt as an argument or on stdin")
        try:
            prompt = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as error:
            raise CommandError(f"the prompt on stdin is not UTF-8 text ({error})") from None
    else:
        prompt = args.prompt
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:  # argv bytes that were not UTF-8
            raise CommandError("the prompt argument is not UTF-8 text") from None
    body: dict[str, Any] = {"provider": args.provider, "prompt": prompt}
    for key in ("id", "conversation", "agent", "workspace", "callback_url", "cwd"):
        value = getattr(args, key)
        if value is not None:
            body[key] = value
    if args.skip_if_busy:
        body["on_busy"] = "skip"
    with client_for(args) as client:
        status, run = client.request("POST", "/v1/runs", json=body)
        if status == 200:
            print(f"{run['id']}: already known ({run['status']})", file=sys.stderr)
        if not args.wait:
            if args.json:
                print_json(run)
            else:
                print(run["id"])
            return 0
        if status != 200:
            # Said before the wait, which may fail: a user who never learnt
            # the id would submit again without --id, and make a second run.
            print(f"{run['id']}: submitted; waiting for it to end", file=sys.stderr)
        run = _waited(client, run, args.wait_timeout)
    if args.json:
        print_json(run)
    elif run["status"] == "succeeded":
        print(run.get("result") or "")
    else:
        detail = run.get("reason")
        print(f"{run['id']}: {run['status']}{f' ({detail})' if detail else ''}", file=sys.stderr)
    return 0 if run["status"] == "succeeded" else 1


def _waited(client: ApiClient, run: Mapping[str, Any], seconds: float | None) -> dict[str, Any]:
    """:func:`_wait` for a run just submitted: a failure says the run was submitted."""
    submitted = f"run {run['id']} was submitted; waiting for it failed"
    try:
        return _wait(client, run, seconds)
    except ApiError as error:
        raise CommandError(f"{submitted}: {error.message} (HTTP {error.status})") from None
    except (ApiUnavailable, CommandError) as error:
        raise CommandError(f"{submitted}: {error}") from None


def _wait(client: ApiClient, run: Mapping[str, Any], seconds: float | None) -> dict[str, Any]:
    deadline = time.monotonic() + seconds if seconds is not None else None
    current = dict(run)
    while current["status"] not in TERMINAL:
        left = 60.0 if deadline is None else min(60.0, deadline - time.monotonic())
        if left <= 0:
            raise CommandError(f"{current['id']} is still {current['status']} after {seconds}s")
        _, current = client.request(
            "GET", f"/v1/runs/{current['id']}", params={"wait": left}, timeout=left + 10
        )
    return current


def _runs(args: argparse.Namespace) -> int:
    if args.run_id is not None:
        filters = [
            flag
            for flag, value in (
                ("--status", args.status),
                ("--provider", args.provider),
                ("--conversation", args.conversation),
                ("--limit", args.limit),
            )
            if value is not None
        ]
        if filters:
            raise UsageError(
                f"{', '.join(filters)} filter the list of runs; leave them out to show"
                f" {args.run_id}, or leave out RUN_ID to list"
            )
    with client_for(args) as client:
        if args.run_id is not None:
            _, run = client.request("GET", f"/v1/runs/{args.run_id}")
            if args.json:
                print_json(run)
            else:
                _print_run(run)
            return 0
        params = {
            "status": args.status,
            "provider": args.provider,
            "conversation": args.conversation,
            "limit": args.limit if args.limit is not None else RUNS_LIMIT,
        }
        _, body = client.request("GET", "/v1/runs", params=params)
    if args.json:
        print_json(body)
        return 0
    runs, now = body["runs"], time.time()
    # The spent column only when a run listed has a spend: the table of
    # agents that report none (plain ones) keeps its width for the rest.
    spent = any(run.get("spend") is not None for run in runs)
    columns = RUN_COLUMNS if spent else tuple(c for c in RUN_COLUMNS if c is not _SPENT)
    print_table(columns, [run_row(run, now, spent=spent) for run in runs])
    return 0


RUNS_LIMIT = 50


# On an 80-column terminal a row takes two lines: the id folded in two, the
# date above the time; the reason and conversation get what is left.
RUN_COLUMNS = (
    Column("id", wrap=True, min_width=18),
    Column("status"),
    Column("provider", wrap=True, min_width=8),
    Column("conversation", wrap=True, min_width=8),
    Column("submitted", wrap=True, min_width=10),
    Column("took", align="right"),
    _SPENT := Column("spent", align="right"),
    Column("reason", wrap=True, min_width=10),
)


def run_row(run: Mapping[str, Any], now: float, *, spent: bool = True) -> list[str]:
    """A run as a row of the ``runs`` table.

    ``took``: how long it ran (so far, while running); ``spent`` (left out
    unless ``spent``): what its last attempt spent, as its stream reported
    it (:func:`spent_cell`);
    ``reason``: the first line of why it ended as it did (``runs RUN_ID``
    shows all of it).
    """
    started, finished = run["started_at"], run["finished_at"]
    took = ""
    if started is not None:
        took = duration_text(max(0.0, (finished if finished is not None else now) - started))
    reason = (run["reason"] or "").strip().split("\n", 1)[0]
    row = [run["id"], run["status"], run["provider"], run["conversation"] or ""]
    row += [local_time(run["submitted_at"]), took]
    if spent:
        row.append(spent_cell(run.get("spend")))
    row.append(reason)
    return row


def _print_run(run: Mapping[str, Any]) -> None:
    """One run, a field a line, times in local ISO-8601; an agent's stream as text."""
    for key, value in run.items():
        if key.endswith("_at") and isinstance(value, int | float):
            shown = local_time_text(value)
        elif key in ("spend", "total_spend") and isinstance(value, dict):
            if key == "total_spend" and not run.get("earlier_attempts"):
                continue  # one attempt: its spend is the total
            first, *models = spend_lines(value)
            shown = first + _spend_scope(run, key) + "".join(f"\n    {line}" for line in models)
        elif key == "earlier_attempts" and isinstance(value, list):
            if not value:
                continue
            shown = "".join(f"\n    {attempt_line(attempt)}" for attempt in value)
        elif key == "excerpt" and isinstance(value, str):
            shown = "\n    " + _readable(value).rstrip("\n").replace("\n", "\n    ")
        elif isinstance(value, str) and "\n" in value:
            shown = "\n    " + value.rstrip("\n").replace("\n", "\n    ")
        elif value is None or value == {}:
            continue
        else:
            shown = str(value)
        print(f"{key + ':':<14}{shown}")


def _spend_scope(run: Mapping[str, Any], key: str) -> str:
    """Which attempts a spend line covers, for a run that was tried more than once."""
    if not run.get("earlier_attempts"):
        return ""
    attempts = run["attempts"]  # its starts: one more than the earlier attempts once started
    return f" — all {attempts} attempts" if key == "total_spend" else f" — attempt {attempts} only"


def _readable(excerpt: str) -> str:
    """A claude or codex excerpt (stream JSON) rendered as ``herdsman logs`` renders it."""
    from herdsman.runtime.runner.protocols import LogText  # noqa: PLC0415

    text = LogText()
    return text.feed(excerpt.encode()) + text.finish()


def _cancel(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        status, run = client.request("POST", f"/v1/runs/{args.run_id}/cancel")
    if args.json:
        print_json(run)
        return 0
    state = run["status"] if status == 200 else f"{run['status']} (being stopped)"
    print(f"{run['id']}: {state}")
    return 0


# RunStatus's values, written out: importing the store package would add
# ~50 ms to every command (tests/unit/test_cli_parser.py keeps them equal).
RUN_STATUSES = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "timed_out",
    "cancelled",
    "lost",
    "skipped",
    "usage_limited",
)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def _runs_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to 1000, got {text!r}")
    return value


def add_submit_command(commands: Any, config_options: OptionsFactory) -> None:
    """Register ``submit``."""
    submit = commands.add_parser(
        "submit",
        parents=[config_options(with_overrides=False)],
        help="submit a run to the running supervisor",
        description="Submit a run to the supervisor running on the configuration file."
        " Prints the new run's id (--json: the run), or with --wait its reply once it"
        " ends; exit status 0 only if it succeeded.",
    )
    submit.add_argument(
        "prompt", nargs="?", metavar="PROMPT", help="the prompt (default, or -: read stdin)"
    )
    submit.add_argument("-p", "--provider", required=True, help="provider name from the config")
    submit.add_argument("--conversation", help="conversation id (runs in one never overlap)")
    submit.add_argument("--agent", help="agent id (one run per agent at a time)")
    submit.add_argument("--workspace", help='workspace scope (default "default")')
    submit.add_argument("--id", help="run id (default: a fresh one); resubmitting is idempotent")
    submit.add_argument("--callback-url", help="URL to POST the finished run to")
    submit.add_argument(
        "--cwd",
        type=os.path.abspath,
        help="the run's working directory (runs in overlapping directories never overlap)",
    )
    submit.add_argument(
        "--skip-if-busy",
        action="store_true",
        help="record the run as skipped if its conversation or agent is busy",
    )
    submit.add_argument(
        "--wait", action="store_true", help="wait for the run to end and print its reply"
    )
    submit.add_argument(
        "--wait-timeout",
        type=_positive_seconds,
        metavar="SECONDS",
        help="with --wait: give up after SECONDS (default: wait as long as it takes)",
    )
    submit.add_argument(
        "--json",
        action="store_true",
        help="print the run as JSON: as submitted, or with --wait as it ended",
    )
    submit.set_defaults(handler=guard(_submit))


def add_runs_command(commands: Any, config_options: OptionsFactory) -> None:
    """Register ``runs``."""
    runs = commands.add_parser(
        "runs",
        parents=[config_options(with_overrides=False)],
        help="list runs, or show one",
        description="List runs, newest first: id, status, provider, conversation, when it was"
        " submitted, how long it ran, and the first line of its reason. With RUN_ID, show"
        " that run in full.",
    )
    runs.add_argument(
        "run_id",
        nargs="?",
        metavar="RUN_ID",
        help="the id of a run (as submit printed it) to show in full (--json: as JSON)",
    )
    runs.add_argument(
        "--status",
        choices=RUN_STATUSES,
        metavar="STATUS",
        help=f"only runs in this status: {', '.join(RUN_STATUSES)}",
    )
    runs.add_argument("--provider", help="only runs of this provider")
    runs.add_argument("--conversation", help="only runs of this conversation")
    runs.add_argument(
        "--limit",
        type=_runs_limit,
        default=None,
        metavar="N",
        help=f"at most N runs, 1 to 1000 (default {RUNS_LIMIT})",
    )
    runs.add_argument("--json", action="store_true", help="machine-readable output")
    runs.set_defaults(handler=guard(_runs))


def add_cancel_command(commands: Any, config_options: OptionsFactory) -> None:
    """Register ``cancel``."""
    cancel = commands.add_parser(
        "cancel",
        parents=[config_options(with_overrides=False)],
        help="cancel a queued or running run",
        description="Cancel a run: a queued one at once, a running one by stopping its"
        " process group (the answer waits up to 10 s for it to stop). Exit status 1 if the"
        " run had already ended.",
    )
    cancel.add_argument(
        "run_id", metavar="RUN_ID", help="the id of the run (as submit or runs printed it)"
    )
    cancel.add_argument(
        "--json", action="store_true", help="print the run as JSON, as the cancel left it"
    )
    cancel.set_defaults(handler=guard(_cancel))
