"""The supervisor's state in the CLI: ``status``, ``accounts`` and ``worktrees``.

What the running supervisor says of its limits, runs, fleet, accounts (and
``accounts end-rest``) and conversations' worktrees (and ``worktrees
sweep``), as tables or JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from herdsman.account_text import account_alerts, account_state, usage_text
from herdsman.cli_common import (
    OptionsFactory,
    UsageError,
    client_for,
    guard,
    local_time_text,
    print_json,
)
from herdsman.cli_tables import Column, local_time, print_table


def _status(args: argparse.Namespace) -> int:
    with client_for(args) as client:
        _, status = client.request("GET", "/v1/status")
    if args.json:
        print_json(status)
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
                _queued_cell(status, provider),
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
            print(f"  until {local_time_text(waiting['until'])}")
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
    """Running, queued, parked (a fleet member's refused claims, shown when any), oldest wait.

    Queued runs waiting out a retry's backoff are counted as queued, and
    said apart with when the first of them is due: ``queued: 3 (1 waiting
    to retry, the first at 15:20:03)``.
    """
    line = f"running: {status['running']}   queued: {status['queued']}"
    retrying, due = status.get("retrying", 0), status.get("next_retry_at")
    if retrying and due is not None:
        at = dt.datetime.fromtimestamp(due).strftime("%H:%M:%S")
        line += f" ({retrying} waiting to retry, the first at {at})"
    if status.get("parked"):
        line += f"   parked: {status['parked']}"
    age = status["oldest_queued_age"]
    return line + (f"   oldest queued: {age:.1f}s" if age is not None else "")


def _queued_cell(status: dict[str, Any], provider: str) -> str:
    """A provider's queued runs: ``3``, or ``3 (1 retrying)`` when some wait out a backoff."""
    queued = str(status["queued_by_provider"].get(provider, 0))
    retrying = status.get("retrying_by_provider", {}).get(provider, 0)
    return f"{queued} ({retrying} retrying)" if retrying else queued


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


def _accounts(args: argparse.Namespace) -> int:
    if args.action == "end-rest":
        return _end_rest(args)
    if args.names:
        raise UsageError(f"unexpected {' '.join(args.names)!r}; did you mean `accounts end-rest`?")
    with client_for(args) as client:
        _, body = client.request("GET", "/v1/accounts")
    if args.json:
        print_json(body)
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
    with client_for(args) as client:
        _, row = client.request(
            "POST", "/v1/accounts/end-rest", json={"provider": provider, "account": account}
        )
    if args.json:
        print_json(row)
        return 0
    name = row["account"] if row["account"] is not None else "(ambient)"
    state = "available" if row["available"] else row["reason"]
    print(f"{row['provider']}/{name}: {state}")
    return 0


def _worktrees(args: argparse.Namespace) -> int:
    if args.dry_run and args.action != "sweep":
        raise UsageError("--dry-run goes with sweep: herdsman worktrees sweep --dry-run")
    with client_for(args) as client:
        if args.action == "sweep":
            _, body = client.request(
                "POST", "/v1/worktrees/sweep", json={"dry_run": args.dry_run}, timeout=600
            )
            rows = body["entries"]
            if args.json:
                print_json(body)
            elif not rows:
                print("nothing is idle for longer than retention.idle")
            for row in [] if args.json else rows:
                detail = f"  ({row['detail']})" if row["detail"] else ""
                print(f"{row['action']:<13} {row['path']}{detail}")
            return 0
        _, body = client.request("GET", "/v1/worktrees")
    if args.json:
        print_json(body)
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


def add_status_command(commands: Any, config_options: OptionsFactory) -> None:
    """Register ``status``."""
    status = commands.add_parser(
        "status",
        parents=[config_options(with_overrides=False)],
        help="limits, running and queued runs",
        description="Show the running supervisor's limits, its running and queued runs per"
        " provider and lane, providers waiting for an account, and the last reload if it"
        " was rejected.",
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=guard(_status))


def add_accounts_command(commands: Any, config_options: OptionsFactory) -> None:
    """Register ``accounts``."""
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
    accounts.set_defaults(handler=guard(_accounts))


def add_worktrees_command(commands: Any, config_options: OptionsFactory) -> None:
    """Register ``worktrees``."""
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
    worktrees.set_defaults(handler=guard(_worktrees))
