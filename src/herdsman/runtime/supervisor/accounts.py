"""The account tracker: rests, ends of rests, the fleet's accounts and the ledger's history.

:class:`AccountTracker` records what happens to accounts in the ledger and
hands each change to the lifecycle once it is recorded (the lifecycle
decides what a rest means for the runs). It reads the history an earlier
process left (rests in force, runs in their quota windows, conversations'
accounts) at a start and at a reload that brings an account back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from operator import methodcaller
from typing import Any

import attrs

from herdsman.config import Config
from herdsman.core.accounts import Charge
from herdsman.core.lifecycle import Lifecycle, LoginNeeded, Rest
from herdsman.core.outcome import AccountSignals
from herdsman.runtime.accounts import account_view, longest_window
from herdsman.runtime.fleet_accounts import FleetAccounts, apply_fleet_accounts
from herdsman.runtime.fleet_member import FleetMember
from herdsman.runtime.ledger import Ledger
from herdsman.runtime.store import AccountLimit, AccountUse, RunRecord, Store
from herdsman.runtime.supervisor.errors import UnknownAccount
from herdsman.runtime.supervisor.outcomes import near_limit_mark

__all__ = ["AccountHistory", "AccountTracker"]

log = logging.getLogger("herdsman.supervisor")


@attrs.frozen
class AccountHistory:
    """What the ledger remembers of accounts: rests in force, runs in their windows."""

    limits: list[AccountLimit]
    uses: list[AccountUse]

    def rests(self) -> list[tuple[str, str | None, float, str]]:
        """The rests, as :meth:`Lifecycle.restore` takes them."""
        return [(rest.provider, rest.account, rest.until, rest.message) for rest in self.limits]

    def windows(
        self,
    ) -> list[tuple[str, str | None, float, float | None, int | None, float | None]]:
        """The runs in their windows, as :meth:`Lifecycle.restore` takes them."""
        return [
            (use.provider, use.account, use.started_at, use.finished_at, use.tokens, use.usd)
            for use in self.uses
        ]


#: No history to restore (a reload that brings no account back).
NO_HISTORY = AccountHistory([], [])


class AccountTracker:
    """Accounts as the ledger records them, handed to ``life`` in ledger order.

    ``emit`` traces an event; ``wake`` wakes the dispatcher (an account
    that rests no more may start runs).
    """

    def __init__(
        self,
        life: Lifecycle,
        ledger: Ledger,
        *,
        wall: Callable[[], float],
        fleet: FleetMember | None,
        emit: Callable[..., None],
        wake: Callable[[], None],
    ) -> None:
        self._life = life
        self._ledger = ledger
        self._wall = wall
        self._fleet = fleet
        self._emit = emit
        self._wake = wake

    def accounts(self) -> list[dict[str, Any]]:
        """Every account: in use, usage in its window, resting until, runs started."""
        return [account_view(s) for s in self._life.book.statuses(self._wall())]

    async def recover(self, now: float, config: Config) -> None:
        """Quota windows, exhaustions and conversations' accounts of earlier processes."""
        sessions = await self._ledger.call(lambda s: s.sessions())
        for session in sessions:
            self._life.remember(
                session.provider, session.workspace, session.conversation, session.account
            )
        # A run lost in a crash (at this start or an earlier one) counts as
        # a start only: the ledger charges it no run-minutes.
        history = await self.history(now, config)
        self._life.restore(history.rests(), history.windows())

    async def history(self, now: float, config: Config) -> AccountHistory:
        """Rests in force and usage within the longest quota window of ``config``.

        A fleet member reads only the runs it started: the others' come with
        every poll (:meth:`take_fleet`), and would count twice.
        """
        window, fleet = longest_window(config), self._fleet

        def usage(store: Store) -> list[AccountUse]:
            if not window:
                return []
            if fleet is None:
                return store.account_usage(now - window)
            return fleet.store.account_usage_by_member(now - window).mine

        limits, uses = await self._ledger.call(lambda s: (s.account_limits(now), usage(s)))
        return AccountHistory(limits, uses)

    async def end_rest(self, provider: str, account: str | None) -> dict[str, Any]:
        """End an account's rest by hand (a limit misread, or bought more quota).

        Raises :class:`UnknownAccount` if the provider has no such account.
        """
        if not self._life.book.knows(provider, account):
            raise UnknownAccount(self._unknown_account(provider, account))

        def cleared(_: None) -> None:
            self._life.end_rest(provider, account)
            log.info("the rest of %s/%s was ended by hand", provider, account or "(ambient)")
            self._emit("rest_ended", provider=provider, account=account)
            self._wake()

        await self._ledger.call(
            methodcaller("clear_account_limit", provider, account), then=cleared
        )
        now = self._wall()
        return next(
            account_view(s)
            for s in self._life.book.statuses(now)
            if (s.provider, s.account) == (provider, account) and not s.retired
        )

    def _unknown_account(self, provider: str, account: str | None) -> str:
        """Why ``provider``/``account`` names no configured account, and what would."""
        book = self._life.book
        if provider not in book.providers:
            configured = ", ".join(book.providers) or "none"
            return f"no provider {provider!r} is configured (configured: {configured})"
        names = [
            s.account
            for s in book.statuses(self._wall())
            if s.provider == provider and not s.retired
        ]
        named = [name for name in names if name is not None]
        if account is None and named:
            return (
                f"provider {provider!r} has no ambient account; name one of its accounts"
                f" ({', '.join(named)}), e.g. `accounts end-rest {provider} {named[0]}`"
            )
        if account is not None and not named:
            return (
                f"provider {provider!r} has no account {account!r}: its only account is"
                f" the ambient one (leave the account out: `accounts end-rest {provider}`)"
            )
        listed = ", ".join(name if name is not None else "(ambient)" for name in names)
        asked = "ambient account" if account is None else f"account {account!r}"
        return f"provider {provider!r} has no {asked}; its accounts: {listed or 'none'}"

    async def rest(self, provider: str, account: str | None, until: float, message: str) -> None:
        """Rest an account until ``until`` (unix seconds), as a usage limit would.

        An account that is not configured, or a time already past, changes
        nothing.
        """
        now = self._wall()
        if not self._life.may_rest(provider, account, until, now):
            return

        def rested(_: None) -> None:
            # As it was asked at ``now``: recorded, it is in force.
            self._life.rest(provider, account, until, message, now)
            self._wake()

        await self._ledger.call(
            methodcaller("set_account_limit", provider, account, until, message), then=rested
        )

    def take_fleet(self, state: FleetAccounts, *, now: float) -> None:
        """Count the other members' runs, and rest accounts as the fleet's ledger says."""
        for provider, account, until in apply_fleet_accounts(self._life, state, now):
            name = "(ambient)" if account is None else account
            if until is None:
                log.info("the rest of %s/%s was ended by another fleet member", provider, name)
                self._wake()
            else:
                log.info(
                    "%s/%s rests until %s, as the fleet's ledger records",
                    provider,
                    name,
                    time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(until)),
                )

    def finished(
        self,
        run_id: str,
        final: RunRecord,
        login: LoginNeeded | None,
        now: float,
        *,
        charge: bool,
    ) -> None:
        """A finish is recorded: say that its account needs a login; charge what it spent.

        ``charge``: the run's tokens are charged only now, as the ledger
        worked them out (``charged_once_recorded``).
        """
        if login is not None:
            log.warning(
                "%s: %s is not logged in (%s); it takes no runs until a reload or"
                " `herdsman accounts end-rest %s%s`",
                login.provider,
                login.label,
                login.message,
                login.provider,
                "" if login.account is None else f" {login.account}",
            )
            self._emit(
                "needs_login",
                run_id=run_id,
                provider=login.provider,
                account=login.account,
                message=login.message,
            )
        spend = final.spend
        if charge and spend is not None and spend.tokens is not None:
            self._life.charge(final.provider, final.account, now, Charge(spend.tokens.budgeted))

    def warned(
        self,
        run_id: str,
        provider: str,
        account: str | None,
        signals: AccountSignals | None,
        now: float,
    ) -> None:
        """Trace that the run's stream warned its account is near its limit, and until when.

        ``signals``: what the run's stream said of its account (nothing
        traced unless it warned). The mark the lifecycle set at the finish
        (the warning's reset if it is believable, else the account's
        window), read back from the book: nothing is traced for an account
        no longer configured.
        """
        if signals is None or not signals.near_limit:
            return
        until = near_limit_mark(self._life.book, provider, account, now)
        if until is not None:
            self._emit("near_limit", run_id=run_id, provider=provider, account=account, until=until)

    def rested(self, hit: Rest, run_id: str) -> None:
        """Say that an account rests after a usage limit (recorded, and in force)."""
        log.warning(
            "%s reached its usage limit on %s; it rests until %s",
            hit.provider,
            hit.label,
            time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(hit.until)),
        )
        self._emit(
            "usage_limit",
            run_id=run_id,
            provider=hit.provider,
            account=hit.account,
            until=hit.until,
        )
