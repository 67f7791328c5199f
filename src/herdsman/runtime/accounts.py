"""From the configuration to the account core, and the account views the API shows."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from herdsman.config import Config, Provider
from herdsman.core.accounts import AccountBook, AccountSpec, AccountStatus, Blocked

_NO_ENV: Mapping[str, str] = MappingProxyType({})


def account_specs(provider: Provider) -> list[AccountSpec]:
    """The core's view of a provider's ``[[accounts]]``, in config order."""
    return [
        AccountSpec(
            account.name,
            window=account.window.total_seconds() if account.window is not None else None,
            budget=account.budget,
            unit=account.budget_unit,
            concurrency=account.concurrency,
        )
        for account in provider.accounts
    ]


def account_book(config: Config) -> AccountBook:
    """A fresh account core for ``config``'s providers."""
    return AccountBook({name: account_specs(p) for name, p in config.providers.items()})


def account_env(provider: Provider, name: str | None) -> Mapping[str, str]:
    """The environment that selects account ``name`` (none for the ambient one)."""
    for account in provider.accounts:
        if account.name == name:
            return account.env
    return _NO_ENV


def longest_window(config: Config) -> float:
    """The longest quota window any account counts in (0 with none)."""
    return max(
        (
            account.window.total_seconds()
            for provider in config.providers.values()
            for account in provider.accounts
            if account.window is not None
        ),
        default=0.0,
    )


def account_view(status: AccountStatus) -> dict[str, Any]:
    """One account as JSON (the API and ``herdsman accounts``)."""
    return {
        "provider": status.provider,
        "account": status.account,
        "running": status.running,
        "running_elsewhere": status.running_elsewhere,
        "usage": round(status.usage, 3),
        "budget": status.budget,
        "unit": status.unit,
        "window": status.window,
        "available": status.available,
        "reason": status.reason,
        "exhausted_until": status.exhausted_until,
        "message": status.message,
        "runs_started": status.runs_started,
        "retired": status.retired,
        "near_limit_until": status.near_limit_until,
        "needs_login": status.needs_login,
    }


def blocked_view(blocked: Blocked) -> dict[str, Any]:
    """Why a provider's queued runs wait for an account, as JSON."""
    return {"reason": blocked.reason, "until": blocked.until}
