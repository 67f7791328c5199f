"""``herdsman usage``: what runs spent, summed from the ledger by conversation, account and more.

It reads the ledger the configuration names (the SQLite file in
``state_dir``, or the PostgreSQL ledger at ``[store] url``) directly, not
through a running supervisor: totals are there whether or not one runs,
and a SQLite reader never waits for the supervisor's writes (WAL).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from herdsman.cli_common import CommandError, guard, load, print_json
from herdsman.cli_tables import Column, print_table
from herdsman.config import Config
from herdsman.config.durations import parse_duration
from herdsman.spend_text import cost_text

if TYPE_CHECKING:
    from herdsman.runtime.store import Store, UsageTotal

__all__ = ["BY", "add_usage_command"]

#: What ``--by`` accepts (UsageBy's values), in the help's order.
BY = ("conversation", "account", "provider", "model")


def _since(text: str) -> float:
    """``--since``: a duration back from now, in seconds (``7d``, ``12h``)."""
    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(
            f'expected a duration back from now such as "7d", "12h" or "90m", got {text!r}'
        )
    return seconds


def _open_ledger(config: Config) -> Store | None:
    """The configured ledger, for reading; None when no SQLite ledger exists yet.

    A PostgreSQL ledger is opened as a plain store, not as the sole
    supervisor nor a fleet member: reading takes no claim on it. Neither is
    upgraded: a supervisor may be writing it (see :class:`LedgerNotCurrent`).
    """
    from herdsman.runtime.main import DB_NAME  # noqa: PLC0415 - keeps the other commands light

    if config.store.url is not None:
        from herdsman.runtime.store.postgres import PostgresStore  # noqa: PLC0415

        return PostgresStore(config.store.url, upgrade=False)
    from herdsman.runtime.store import SqliteStore  # noqa: PLC0415

    path = config.supervisor.state_dir / DB_NAME
    if not path.exists():  # no run was ever recorded; opening would create the file
        return None
    return SqliteStore(path, upgrade=False)


def _usage(args: argparse.Namespace) -> int:
    from herdsman.runtime.store import StoreError, UsageBy  # noqa: PLC0415
    from herdsman.runtime.store.errors import LedgerNotCurrent  # noqa: PLC0415

    config = load(args)
    since = None if args.since is None else time.time() - args.since
    try:
        store = _open_ledger(config)
        totals: list[UsageTotal] = []
        if store is not None:
            try:
                totals = store.usage(UsageBy(args.by), since)
            finally:
                store.close()
    except LedgerNotCurrent as exc:
        if exc.version != 0:
            raise CommandError(str(exc)) from None
        totals = []  # a ledger no supervisor has used yet: nothing was spent
    except StoreError as exc:
        raise CommandError(str(exc)) from None
    if args.json:
        print_json({"by": args.by, "since": since, "totals": [_total_json(t) for t in totals]})
        return 0
    columns, rows = usage_table(args.by, totals)
    print_table(columns, rows)
    return 0


def _total_json(total: UsageTotal) -> dict[str, Any]:
    from herdsman.runtime.store.records import tokens_json  # noqa: PLC0415

    shown: dict[str, Any] = {"group": total.group}
    if total.workspace is not None:
        shown["workspace"] = total.workspace
    return shown | {
        "runs": total.runs,
        "attempts": total.attempts,
        "tokens": tokens_json(total.tokens),
        "cost_usd": total.cost_usd,
        "priced": total.priced,
        "turns": total.turns,
        "api_time": total.api_time,
    }


_FIGURES = (
    Column("runs", align="right"),
    Column("attempts", align="right"),
    Column("input", align="right"),
    Column("cache read", align="right"),
    Column("cache write", align="right"),
    Column("output", align="right"),
    Column("cost", align="right"),
)
# A group's name where the runs had none.
_NONE = {"conversation": "(none)", "account": "(ambient)"}


def usage_table(
    by: str, totals: Sequence[UsageTotal]
) -> tuple[tuple[Column, ...], list[list[str]]]:
    """The ``usage`` table: a row a group, its runs and their attempts, tokens by kind and cost.

    Every attempt's spend counts (a retried run spent on each). A cost some
    attempts of the group did not state reads ``$0.0123 (2 of 3)``: the sum
    of the costs stated by 2 of the 3 attempts, never a guess for the others.
    """
    keys: tuple[Column, ...] = (Column(by, wrap=True),)
    if by == "conversation":
        keys = (Column("workspace", wrap=True), *keys)
    rows = []
    for total in totals:
        named = [total.group if total.group is not None else _NONE.get(by, "")]
        if by == "conversation":
            named = [total.workspace or "", *named]
        cost = cost_text(total.cost_usd)
        if cost and total.priced < total.attempts:
            cost += f" ({total.priced} of {total.attempts})"
        tokens = total.tokens
        rows.append(
            [
                *named,
                str(total.runs),
                str(total.attempts),
                f"{tokens.input:,}",
                f"{tokens.cache_read:,}",
                f"{tokens.cache_write:,}",
                f"{tokens.output:,}",
                cost,
            ]
        )
    return (*keys, *_FIGURES), rows


def add_usage_command(
    commands: Any, config_options: Callable[..., argparse.ArgumentParser]
) -> None:
    """Add ``herdsman usage`` to the command line."""
    usage = commands.add_parser(
        "usage",
        parents=[config_options(with_overrides=False)],
        help="what runs spent: tokens and cost, by conversation, account, provider or model",
        description="Sum what the ledger's runs spent on every attempt (tokens by kind, cost in"
        " US dollars where the agent's stream stated it; a retried run spent on each attempt)"
        " by conversation, account, provider or model. Reads the ledger directly: no running"
        " supervisor is needed.",
    )
    usage.add_argument(
        "--by",
        choices=BY,
        default="provider",
        metavar="GROUP",
        help=f"what to sum by: {', '.join(BY)} (default provider)",
    )
    usage.add_argument(
        "--since",
        type=_since,
        metavar="DURATION",
        help="only attempts that finished within DURATION of now, e.g. 7d, 12h, 90m"
        " (default: every run the ledger holds)",
    )
    usage.add_argument("--json", action="store_true", help="machine-readable output")
    usage.set_defaults(handler=guard(_usage))
