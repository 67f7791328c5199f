"""An account's usage and state as ``herdsman accounts`` and ``status`` show them.

From the API's account view (``runtime.accounts.account_view``): usage in
the account's own unit (``3/10 runs``, ``1.2M tokens of 5M``, ``$3.20 of
$20.00``), and the state: available, near its limit, resting, needing a login.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herdsman.cli_tables import local_time
from herdsman.spend_text import tokens_short

__all__ = ["account_alerts", "account_state", "usage_text"]


def usage_text(row: Mapping[str, Any]) -> str:
    """The usage cell: what the account used in its window, of its budget if it has one."""
    usage, budget, unit = row["usage"], row["budget"], row["unit"]
    if unit == "tokens":
        text = f"{tokens_short(round(usage))} tokens"
        return text if budget is None else f"{text} of {tokens_short(round(budget))}"
    if unit == "usd":
        text = f"${usage:,.2f}"
        return text if budget is None else f"{text} of ${budget:,.2f}"
    text = f"{usage:g}"
    if budget is not None:
        text = f"{text}/{budget:g} {'runs' if unit == 'runs' else 'run-min'}"
    return text


def account_state(row: Mapping[str, Any]) -> str:
    """The state cell: available (perhaps near its limit), or why not and until when."""
    near = row.get("near_limit_until")
    if row["available"]:
        if near is not None:
            return f"available, near its limit until {local_time(near)}"
        return "available"
    if row["exhausted_until"] is not None and row["reason"] == "usage limit reached":
        return f"usage limit until {local_time(row['exhausted_until'])}"
    return str(row["reason"])


def account_alerts(accounts: list[Mapping[str, Any]]) -> list[str]:
    """``status``'s lines for accounts that need a login or are near their limit."""
    lines = []
    for row in accounts:
        name = f"{row['provider']}/{row['account'] or '(ambient)'}"
        account = row["account"]
        if row.get("needs_login") is not None:
            lines.append(
                f"{name} needs a login ({row['needs_login']}): it takes no runs until a reload"
                f" or `herdsman accounts end-rest {row['provider']}"
                f"{'' if account is None else ' ' + account}`"
            )
        elif row.get("near_limit_until") is not None:
            lines.append(
                f"{name} is near its limit until {local_time(row['near_limit_until'])}:"
                " new conversations go to other accounts first"
            )
    return lines
