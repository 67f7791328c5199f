"""A fleet member's accounts: the fleet's rests and quota usage, read from the shared ledger.

Each member keeps its own account core (:class:`~herdsman.core.accounts.AccountBook`),
which counts the runs this member starts as they start and end. In a fleet
(docs/fleet.md) three things make it reflect the whole fleet:

* **Rests.** The ``account_limits`` table is the fleet's truth: a member
  that sees a usage limit, or is told to rest or end a rest, writes it
  there. At every poll the book's rests are set to exactly what the table
  holds (:meth:`AccountBook.sync_rests`), so a rest recorded or ended
  through any member is in force, or over, everywhere within one poll.
* **Usage.** At every poll the runs other members charged to accounts in
  the longest window are read and handed to the book as a snapshot that
  replaces the last one (:meth:`AccountBook.set_elsewhere`). This member's
  own runs, and the earlier attempts it ran, are told apart by the ledger's
  ``held_by`` (of ``runs`` and of ``run_attempts``) and never read back, so
  no attempt is counted twice, whatever the timing.
* **Claims.** The poll makes the local view at most one poll old; the
  claim is what holds the budget exactly: under the fleet lock it refuses
  a run on a resting account or one whose budget the fleet has spent
  (:func:`claim_budgets` hands it this member's budgets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from herdsman.config import Config
from herdsman.core.lifecycle import Lifecycle
from herdsman.runtime.store import AccountLimit, AccountUse

if TYPE_CHECKING:
    from herdsman.runtime.fleet_ports import FleetLedger
    from herdsman.runtime.store.fleet import AccountBudget

__all__ = ["FleetAccounts", "apply_fleet_accounts", "claim_budgets", "read_fleet_accounts"]


@attrs.frozen
class FleetAccounts:
    """What the ledger says of the fleet's accounts at one poll."""

    #: Rests in force, recorded by any member.
    limits: list[AccountLimit]
    #: Runs of the other members (and of earlier supervisors) in the longest window.
    elsewhere: list[AccountUse]


def read_fleet_accounts(store: FleetLedger, now: float, window: float) -> FleetAccounts:
    """Ledger operation: the rests in force at ``now``, and others' usage since ``now - window``.

    ``window`` is the longest quota window configured (0: nothing is counted).
    """
    limits = store.account_limits(now)
    elsewhere = store.account_usage_by_member(now - window).elsewhere if window else []
    return FleetAccounts(limits, elsewhere)


def apply_fleet_accounts(
    life: Lifecycle, state: FleetAccounts, now: float
) -> list[tuple[str, str | None, float | None]]:
    """Make ``life`` count the fleet's usage and rest as the fleet does.

    Returns the rests that changed (see :meth:`Lifecycle.sync_accounts`).
    """
    return life.sync_accounts(
        ((limit.provider, limit.account, limit.until, limit.message) for limit in state.limits),
        state.elsewhere,
        now,
    )


def claim_budgets(config: Config) -> dict[tuple[str, str], AccountBudget]:
    """Every configured account budget, as a claim enforces it fleet-wide."""
    from herdsman.runtime.store.fleet import AccountBudget  # noqa: PLC0415 - psycopg

    return {
        (provider_name, account.name): AccountBudget(
            account.window.total_seconds(), account.budget, account.budget_unit
        )
        for provider_name, provider in config.providers.items()
        for account in provider.accounts
        if account.budget is not None and account.window is not None
    }
