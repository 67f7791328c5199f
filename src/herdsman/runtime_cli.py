"""The runtime subcommands: ``run`` (the supervisor) and the API clients.

``submit``, ``status``, ``runs``, ``cancel``, ``logs`` and ``reload`` talk to
a running supervisor over its HTTP API, found through the same configuration
file (``api.listen`` and the token file in ``state_dir``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from herdsman.account_text import account_alerts, account_state, usage_text
from herdsman.attempt_text import attempt_line
from herdsman.cli_tables import Column, duration_text, local_time, print_table
from herdsman.config import Config, ConfigError, load_config
from herdsman.runtime.api.client import ApiClient, ApiError, ApiUnavailable
from herdsman.runtime.ids import run_id_problem
from herdsman.spend_text import spend_lines, spent_cell

if TYPE_CHECKING:
    from herdsman.runtime.runner.protocols import LogText

OptionsFactory = Callable[..., argparse.ArgumentParser]
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "lost", "skipped", "usage_limited"}


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


class UsageError(CommandError):
    """Flags that do not go together, or a missing argument: one line, exit status 2."""


def _load(args: argparse.Namespace) -> Config:
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
        return _load(args)
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


def _client_for(args: argparse.Namespace) -> ApiClient:
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
        client = _pointed(path)
        if client is not None:
            return client
    return _client(_located(args))


def _pointed(config_file: Path) -> ApiClient | None:
    from herdsman.runtime.pointer import read_pointer  # noqa: PLC0415

    pointer = read_pointer(config_file)
    if pointer is None:
        return None
    return ApiClient.with_token_file(pointer.url, pointer.token_file)


def _client(config: Config) -> ApiClient:
    from herdsman.runtime.main import token_path  # noqa: PLC0415 - keeps `check` light

    return ApiClient.for_config(config, token_path(config))


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _guard(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
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


# -- submit -------------------------------------------------------------------


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
    with _client_for(args) as client:
        status, run = client.request("POST", "/v1/runs", json=body)
        if status == 200:
            print(f"{run['id']}: already known ({run['status']})", file=sys.stderr)
        if not args.wait:
            if args.json:
                _print_json(run)
            else:
                print(run["id"])
            return 0
        if status != 200:
            # Said before the wait, which may fail: a user who never learnt
            # the id would submit again without --id, and make a second run.
            print(f"{run['id']}: submitted; waiting for it to end", file=sys.stderr)
        run = _waited(client, run, args.wait_timeout)
    if args.json:
        _print_json(run)
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


# -- status, runs, cancel, reload ---------------------------------------------


def _status(args: argparse.Namespace) -> int:
    with _client_for(args) as client:
        _, status = client.request("GET", "/v1/status")
    if args.json:
        _print_json(status)
        return 0
    limits = status["limits"]
    print(f"admitting new runs: {'yes' if status['admitting'] else 'no (shutting down)'}")
    print(f"config generation:  {status['generation']}")
    print(f"global cap:         {limits['global'] if limits['global'] is not None else 'none'}")
    print(_counts_line(status))
    print()
    print_table(
        PROVIDER_COLUMNS,
        [
            [
                provider,
                str(cap),
                str(status["running_by_provider"].get(provider, 0)),
                str(status["queued_by_provider"].get(provider, 0)),
            ]
            for provider, cap in sorted(limits["providers"].items())
        ],
    )
    last = status.get("last_reload")
    if last is not None and not last["ok"]:
        print()
        print(f"  the last reload ({last['trigger']}) was rejected; nothing changed:")
        for error in last["errors"]:
            print(f"    {error}")
    if status.get("waiting_for_restart"):
        print()
        print("  in the file but waiting for a restart (the running values are kept):")
        for change in status["waiting_for_restart"]:
            print(f"    {change['key']}: {change['old']} -> {change['new']}")
    for provider, reason in sorted(status.get("waiting_for_provider", {}).items()):
        print()
        print(f"  {provider}: {reason}")
    for line in account_alerts(status.get("accounts", [])):
        print()
        print(f"  {line}")
    for provider, waiting in sorted(status.get("waiting_for_accounts", {}).items()):
        print()
        print(f"  {provider} waits for an account: {waiting['reason']}")
        if waiting["until"] is not None:
            print(f"  until {_local_time(waiting['until'])}")
    if status["queued_by_lane"]:
        print()
        print_table(
            LANE_COLUMNS,
            [[str(count), lane] for lane, count in status["queued_by_lane"].items()],
        )
    if "fleet" in status:
        _print_fleet(status["fleet"])
    return 0


def _counts_line(status: dict[str, Any]) -> str:
    """Running, queued, parked (a fleet member's refused claims, shown when any), oldest wait."""
    line = f"running: {status['running']}   queued: {status['queued']}"
    if status.get("parked"):
        line += f"   parked: {status['parked']}"
    age = status["oldest_queued_age"]
    return line + (f"   oldest queued: {age:.1f}s" if age is not None else "")


def _print_fleet(fleet: dict[str, Any]) -> None:
    """The fleet's members from a member's status: ``*`` marks the one answering."""
    print()
    if "error" in fleet:
        print(f"fleet: {fleet['error']}")
        return
    members = fleet["members"]
    print(f"fleet: {len(members)} member(s), {fleet['running']} running")
    rows = []
    for member in members:
        left = member["lease_left"]
        rows.append(
            [
                member["id"] + (" (this one)" if member["this"] else ""),
                f"{member['host']}:{member['pid']}",
                f"{left:.1f}s" if left >= 0 else "lapsed",
                str(member["running"]),
                ", ".join(f"{p} {n}" for p, n in member["running_by_provider"].items()),
            ]
        )
    print_table(FLEET_COLUMNS, rows)
    if fleet["running_unheld"]:
        unheld = fleet["running_unheld"]
        print(f"{unheld} running run(s) held by no member: lost at the next expiry")


def _local_time(when: float) -> str:
    return dt.datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")


def _accounts(args: argparse.Namespace) -> int:
    if args.action == "end-rest":
        return _end_rest(args)
    if args.names:
        raise UsageError(f"unexpected {' '.join(args.names)!r}; did you mean `accounts end-rest`?")
    with _client_for(args) as client:
        _, body = client.request("GET", "/v1/accounts")
    if args.json:
        _print_json(body)
        return 0
    rows = []
    for row in body["accounts"]:
        name = row["account"] if row["account"] is not None else "(ambient)"
        usage, state = usage_text(row), account_state(row)
        # In a fleet: this member's runs, then the other members' ("1+2").
        in_use = f"{row['running']}"
        if row.get("running_elsewhere"):
            in_use += f"+{row['running_elsewhere']}"
        rows.append([row["provider"], name, in_use, usage, str(row["runs_started"]), state])
    print_table(ACCOUNT_COLUMNS, rows)
    return 0


def _end_rest(args: argparse.Namespace) -> int:
    if not 1 <= len(args.names) <= 2:
        raise UsageError(
            "accounts end-rest needs PROVIDER and ACCOUNT (ACCOUNT left out: its ambient"
            " environment)"
        )
    provider, account = args.names[0], (args.names[1] if len(args.names) == 2 else None)
    with _client_for(args) as client:
        _, row = client.request(
            "POST", "/v1/accounts/end-rest", json={"provider": provider, "account": account}
        )
    if args.json:
        _print_json(row)
        return 0
    name = row["account"] if row["account"] is not None else "(ambient)"
    state = "available" if row["available"] else row["reason"]
    print(f"{row['provider']}/{name}: {state}")
    return 0


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
    with _client_for(args) as client:
        if args.run_id is not None:
            _, run = client.request("GET", f"/v1/runs/{args.run_id}")
            if args.json:
                _print_json(run)
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
        _print_json(body)
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
PROVIDER_COLUMNS = (
    Column("provider", wrap=True),
    Column("cap", align="right"),
    Column("running", align="right"),
    Column("queued", align="right"),
)
LANE_COLUMNS = (Column("queued", align="right"), Column("lane", wrap=True))
FLEET_COLUMNS = (
    Column("member", wrap=True, min_width=12),
    Column("host:pid", wrap=True),
    Column("lease left", align="right"),
    Column("running", align="right"),
    Column("per provider", wrap=True),
)
ACCOUNT_COLUMNS = (
    Column("provider", wrap=True),
    Column("account", wrap=True),
    Column("in use", align="right"),
    Column("usage", align="right"),
    Column("started", align="right"),
    Column("state", wrap=True),
)
WORKTREE_COLUMNS = (
    Column("conversation", wrap=True),
    Column("repo", wrap=True),
    Column("last used", wrap=True, min_width=10),
    Column("state", wrap=True),
    Column("size", align="right"),
    Column("path", wrap=True),
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
            shown = _local_time(value)
        elif key == "spend" and isinstance(value, dict):
            first, *models = spend_lines(value)
            shown = first + "".join(f"\n    {line}" for line in models)
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


def _readable(excerpt: str) -> str:
    """A claude or codex excerpt (stream JSON) rendered as ``herdsman logs`` renders it."""
    from herdsman.runtime.runner.protocols import LogText  # noqa: PLC0415

    text = LogText()
    return text.feed(excerpt.encode()) + text.finish()


def _cancel(args: argparse.Namespace) -> int:
    with _client_for(args) as client:
        status, run = client.request("POST", f"/v1/runs/{args.run_id}/cancel")
    if args.json:
        _print_json(run)
        return 0
    state = run["status"] if status == 200 else f"{run['status']} (being stopped)"
    print(f"{run['id']}: {state}")
    return 0


def _worktrees(args: argparse.Namespace) -> int:
    if args.dry_run and args.action != "sweep":
        raise UsageError("--dry-run goes with sweep: herdsman worktrees sweep --dry-run")
    with _client_for(args) as client:
        if args.action == "sweep":
            _, body = client.request(
                "POST", "/v1/worktrees/sweep", json={"dry_run": args.dry_run}, timeout=600
            )
            rows = body["entries"]
            if args.json:
                _print_json(body)
            elif not rows:
                print("nothing is idle for longer than retention.idle")
            for row in [] if args.json else rows:
                detail = f"  ({row['detail']})" if row["detail"] else ""
                print(f"{row['action']:<13} {row['path']}{detail}")
            return 0
        _, body = client.request("GET", "/v1/worktrees")
    if args.json:
        _print_json(body)
        return 0
    rows = []
    for row in body["worktrees"]:
        conversation = row["conversation"]
        if row["workspace"] != "default":
            conversation = f"{row['workspace']}/{conversation}"
        size = f"{row['size_bytes'] / 1e6:.1f} MB"
        used = local_time(dt.datetime.fromisoformat(row["last_used"]).timestamp())
        rows.append([conversation, row["repo"], used, row["status"], size, row["path"]])
    print_table(WORKTREE_COLUMNS, rows)
    return 0


def _reload(args: argparse.Namespace) -> int:
    with _client_for(args) as client:
        _, body = client.request("POST", "/v1/reload", timeout=120, answers=(422,))
    if args.json:
        _print_json(body)
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
    print(f"{since} ({what}, generation {body['generation']}); nothing to do")


def reload_running(config: Config, config_file: Path) -> int:
    """Reload the supervisor running on ``config_file`` (after ``config set``).

    Found by the pointer it left, else at the address ``config`` gives.
    """
    try:
        with _pointed(config_file) or _client(config) as client:
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
        when = _local_time(body["at"])
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


# -- logs ---------------------------------------------------------------------


def _logs(args: argparse.Namespace) -> int:
    if problem := run_id_problem(args.run_id):
        raise UsageError(f"run id {problem}")
    from herdsman.runtime.runner.protocols import LogText  # noqa: PLC0415

    config = _load(args)
    state_dir = config.supervisor.state_dir
    path = state_dir / "logs" / f"{args.run_id}.log"
    text = None if args.raw else LogText()
    if not args.follow:
        if not path.exists() and not path.is_symlink():
            raise CommandError(_missing_log(args, path))
        _copy_log(state_dir, path, 0, text)
        _finish_log(text)
        return 0
    with _client_for(args) as client:
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
        with _client_for(args) as client:
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


# -- parser -------------------------------------------------------------------

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


def _add_logs_command(commands: Any, config_options: OptionsFactory) -> None:
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
    logs.set_defaults(handler=_guard(_logs))


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
    run.set_defaults(handler=_guard(_run))

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
    submit.set_defaults(handler=_guard(_submit))

    status = commands.add_parser(
        "status",
        parents=[config_options(with_overrides=False)],
        help="limits, running and queued runs",
        description="Show the running supervisor's limits, its running and queued runs per"
        " provider and lane, providers waiting for an account, and the last reload if it"
        " was rejected.",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=_guard(_status))

    accounts = commands.add_parser(
        "accounts",
        parents=[config_options(with_overrides=False)],
        help="accounts: in use, usage in the window, resting until, runs started",
        description="List every provider's accounts: runs holding each, usage in the window"
        " against its budget, whether it is available or resting (and until when), runs"
        " started. `accounts end-rest PROVIDER [ACCOUNT]` ends an account's rest now.",
    )
    accounts.add_argument(
        "action",
        nargs="?",
        choices=("end-rest",),
        metavar="end-rest",
        help="make a resting account available again now (leave out to list the accounts)",
    )
    accounts.add_argument(
        "names",
        nargs="*",
        metavar="PROVIDER [ACCOUNT]",
        help="with end-rest: the provider and the account's name (ACCOUNT left out: the"
        " provider's ambient environment)",
    )
    accounts.add_argument("--json", action="store_true", help="machine-readable output")
    accounts.set_defaults(handler=_guard(_accounts))

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
    runs.set_defaults(handler=_guard(_runs))

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
    cancel.set_defaults(handler=_guard(_cancel))

    _add_logs_command(commands, config_options)

    worktrees = commands.add_parser(
        "worktrees",
        parents=[config_options(with_overrides=False)],
        help="list conversations' worktrees (or: worktrees sweep [--dry-run])",
        description="List every conversation's worktrees: repo, last used, clean or dirty,"
        " size, path. `worktrees sweep` removes the clean ones idle for longer than the"
        " running supervisor's retention.idle now.",
    )
    worktrees.add_argument(
        "action",
        nargs="?",
        choices=("sweep",),
        metavar="sweep",
        help="sweep idle clean worktrees now (leave out to list them)",
    )
    worktrees.add_argument(
        "--dry-run", action="store_true", help="with sweep: say what would go, remove nothing"
    )
    worktrees.add_argument("--json", action="store_true", help="machine-readable output")
    worktrees.set_defaults(handler=_guard(_worktrees))

    reload = commands.add_parser(
        "reload",
        parents=[config_options(with_overrides=False)],
        help="reload the configuration file and print what changed",
        description="Ask the supervisor running on the configuration file to read it again"
        " and apply all of it or none; print what changed. Exit status 1 if the file was"
        " rejected.",
    )
    reload.add_argument("--json", action="store_true", help="machine-readable output")
    reload.set_defaults(handler=_guard(_reload))
