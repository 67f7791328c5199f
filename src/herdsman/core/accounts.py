"""The sans-IO account core: which account a run that is about to start spends.

The model (docs/accounts.md has the long form):

* A provider spends *accounts*, in the order the config lists them. A provider
  that declares none has one implicit account, the *ambient* environment
  (named ``None`` here), so a usage limit pauses it the same way.
* An account is *available* at ``now`` when it is not exhausted (a provider
  said its quota is spent, until a reset time), does not need a login (a run
  on it failed to authenticate, until a reload or an end of its rest), it
  runs fewer runs than its ``concurrency`` cap, and its usage in the rolling
  ``window`` is below its ``budget``. Usage is counted in ``runs`` (runs
  started in the window), in ``run_minutes`` (minutes of runs that ended in
  the window, plus the minutes its running runs have run so far), or in
  ``tokens`` or ``usd`` (what runs that ended in the window spent, plus an
  estimate for each running run: the mean of the ended runs that stated the
  figure, since a run's spend is known only at its end; :class:`Charge`).
* In a fleet, an account's usage also counts the runs other members started
  on it (:meth:`AccountBook.set_elsewhere`, a snapshot the caller replaces
  whole at every poll of the shared ledger), and its rest is the one the
  ledger holds (:meth:`AccountBook.sync_rests`).
* A conversation keeps the account it used last while that account is
  available: its agent's resumable session lives under that account. When it
  must move, :class:`Pick` says so and the caller starts a fresh session.
* Otherwise the available account that is not *near its limit* (a provider
  warned so, until the warning's reset) is picked before one that is, then
  the one with the fewest running runs, then the one with the smallest share
  of its budget used, then the first in config order.

No clock, no I/O, no randomness: every call takes ``now`` (unix seconds), and
iteration is over config order or explicit sorted keys, never hash order.

Why this module is a little over 600 lines: the budget arithmetic of one
account lives in ``account_usage.py``; what is left — the book of every
provider's accounts and the gate a burst of starts goes through — shares
the per-account state on the pick path every start takes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

from herdsman.core.account_usage import (
    NO_CHARGE,
    AccountSpec,
    AccountState,
    AccountUse,
    BudgetUnit,
    Charge,
    FleetUsage,
    amount_text,
    spent_with_estimate,
)
from herdsman.core.runs import RunRequest

__all__ = [
    "DEFAULT_REST",
    "MAX_REST",
    "NO_CHARGE",
    "AccountBook",
    "AccountGate",
    "AccountSpec",
    "AccountStatus",
    "AccountUse",
    "Blocked",
    "BudgetUnit",
    "Charge",
    "Pick",
    "amount_text",
    "conversation_of",
    "spent_with_estimate",
    "sticky_key",
]


#: How long an account rests after a usage limit that named no reset time,
#: when the account has no window to wait out either.
DEFAULT_REST = 3600.0
#: The furthest ahead a reported reset is believed: beyond any quota period
#: providers use (weekly limits), so anything later is a misread.
MAX_REST = 31 * 86400.0


@attrs.frozen
class Pick:
    """The account a run spends; ``moved`` when its conversation used another one last.

    A moved conversation's session stays behind under ``moved_from`` (None: the
    ambient environment), so the run must start a fresh one.
    """

    account: str | None
    moved: bool = False
    moved_from: str | None = None


@attrs.frozen
class AccountStatus:
    """One account's state, for status pages and ``herdsman accounts``."""

    provider: str
    account: str | None
    running: int
    usage: float
    budget: float | None
    unit: BudgetUnit
    window: float | None
    exhausted_until: float | None
    message: str | None
    runs_started: int
    available: bool
    #: Why it is not available (None when it is).
    reason: str | None
    #: Still holding running runs, but no longer in the config.
    retired: bool = False
    #: Runs other members of the fleet run on the account (0 outside a fleet).
    running_elsewhere: int = 0
    #: Until when (unix seconds) the provider's warning that the account is
    #: near its limit holds; None when it gave none (or it is over).
    near_limit_until: float | None = None
    #: Why the account needs a login (what a run met); None when it does not.
    needs_login: str | None = None


@attrs.frozen
class Blocked:
    """A provider none of whose accounts can take a run: why, and until when."""

    provider: str
    reason: str
    #: When time alone makes an account available again (None: only a run
    #: ending, or a reload, can).
    until: float | None


def sticky_key(workspace: str, conversation: str) -> str:
    """The key a conversation's account is remembered under."""
    return f"{workspace}/{conversation}"


def conversation_of(run: RunRequest) -> str | None:
    """The stickiness key of a run: its workspace and conversation, if it has one."""
    if run.conversation is None:
        return None
    return sticky_key(run.workspace, run.conversation)


class AccountBook:
    """Accounts of every provider, their usage, and which account each run holds.

    Drive it with :meth:`start` and :meth:`finish` for every run, and
    :meth:`exhaust` when a provider reports a usage limit; ask :meth:`pick`
    (or hand :meth:`gate` to :meth:`Scheduler.take_startable
    <herdsman.core.Scheduler.take_startable>`) which account a run spends.
    """

    def __init__(self, providers: Mapping[str, Sequence[AccountSpec]] | None = None) -> None:
        self._accounts: dict[str, list[AccountState]] = {}
        # Accounts a reload removed while runs still held them: counted, never picked.
        self._retired: dict[tuple[str, str | None], AccountState] = {}
        self._holders: dict[str, tuple[str, AccountState]] = {}  # run id -> (provider, account)
        self._last: dict[tuple[str, str], str | None] = {}  # (provider, conversation)
        # Accounts given runs ahead of their start: run id -> account name.
        self._pins: dict[str, str | None] = {}
        self._plain_picks: dict[str | None, Pick] = {}
        #: The account-side signal (read-only): providers none of whose
        #: accounts can take a run, each with ``(since, until)`` as
        #: :meth:`blocked_until` found at ``since`` (``until`` is ``math.inf``
        #: when only an event can free one). Every change to one of a
        #: provider's accounts (a start, an end, a rest, a reload...) removes
        #: its entry, and time alone changes nothing before ``until``, so
        #: while ``since <= now < until`` the provider can start nothing: a
        #: dispatcher skips it without asking. An attribute, not a method: it
        #: is read at every dispatch.
        self.closed: dict[str, tuple[float, float]] = {}
        #: Whether time alone may ever make an account available again (see
        #: :meth:`next_change`): some account has a budget over a window, or
        #: some account has rested. False means :meth:`next_change` is None for
        #: every provider, so a caller may skip asking. Once true it stays so.
        self.may_free_in_time = False
        for provider, specs in (providers or {}).items():
            self.configure(provider, specs)

    # -- configuration -----------------------------------------------------

    def configure(self, provider: str, specs: Sequence[AccountSpec]) -> None:
        """Set a provider's accounts (an empty list: the ambient environment).

        An account kept by name keeps its usage, exhaustion and running runs;
        its new limits apply to picks from now on. A removed account's running
        runs keep it until they end.
        """
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"provider {provider!r}: account names repeat: {names}")
        if not specs:
            specs = (AccountSpec(None),)
        if any(spec.budget is not None and spec.window is not None for spec in specs):
            self.may_free_in_time = True
        old = {account.spec.name: account for account in self._accounts.get(provider, ())}
        accounts = []
        for spec in specs:
            account = old.pop(spec.name, None) or self._retired.pop((provider, spec.name), None)
            if account is None:
                account = AccountState(spec)
            account.configure(spec)
            accounts.append(account)
        self._accounts[provider] = accounts
        self.closed.pop(provider, None)
        for name, account in old.items():
            if account.running:
                self._retired[(provider, name)] = account

    def remove_provider(self, provider: str) -> None:
        """Forget a provider; its running runs keep their accounts until they end."""
        self.closed.pop(provider, None)
        for account in self._accounts.pop(provider, ()):
            if account.running:
                self._retired[(provider, account.spec.name)] = account

    def knows(self, provider: str, account: str | None) -> bool:
        """Whether ``account`` is one of ``provider``'s configured accounts now."""
        return any(a.spec.name == account for a in self._accounts.get(provider, ()))

    @property
    def providers(self) -> list[str]:
        """Configured providers, in configuration order."""
        return list(self._accounts)

    # -- decisions ---------------------------------------------------------

    def available(self, provider: str, now: float) -> bool:
        """Whether some account of ``provider`` can take a run now."""
        return self.blocked_until(provider, now) is None

    def blocked_until(self, provider: str, now: float) -> float | None:
        """None if some account of ``provider`` can take a run now; else until when none can.

        That is the first moment time alone may free one (:meth:`next_change`),
        or ``math.inf`` if only an event can (a run's end, a reload). Asked
        before every start and whenever runs wait, it is remembered until that
        moment: only a change to one of the provider's accounts (a start, an
        end, a rest, a reload...) can free one sooner, and each forgets it.
        """
        known = self.closed.get(provider)
        if known is not None and known[0] <= now < known[1]:
            return known[1]
        until = math.inf
        # A plain loop: asked before every start, where any() over a generator costs twice.
        for account in self._accounts.get(provider, ()):
            spec = account.spec
            # A free account only a rest can stop (the ambient one, as a rule)
            # needs no call.
            if (
                account.exhausted_until is None
                and account.needs_login is None
                and spec.concurrency is None
                and spec.budget is None
            ):
                return None
            # One pass per account: whether it can take a run, and if not, until when.
            at = account.blocked_until(now)
            if at is None:
                return None
            # Not min(): a call of its own, asked of every closed account at
            # every dispatch; the comparison saves 1.2% of a month plan's
            # instructions (plan_month.py --cachegrind).
            if at < until:  # noqa: PLR1730
                until = at
        self.closed[provider] = (now, until)
        return until

    def pick(self, provider: str, conversation: str | None, now: float) -> Pick | None:
        """The account a run of ``conversation`` should spend, or None if none can."""
        chosen = self._choose(provider, conversation, now)
        return None if chosen is None else chosen[0]

    def _choose(
        self, provider: str, conversation: str | None, now: float, *, known_open: bool = False
    ) -> tuple[Pick, AccountState] | None:
        """:meth:`pick`, with the account it picked.

        ``known_open``: :meth:`blocked_until` has just found that an account
        of the provider can take a run at ``now``, and nothing changed since
        (the gate's ``can_start``, before each start): a lone account is
        that one, and is not asked again.
        """
        accounts = self._accounts.get(provider, ())
        has_last = conversation is not None and (provider, conversation) in self._last
        last = self._last[provider, conversation] if conversation is not None and has_last else None
        best: AccountState | None = None
        if len(accounts) == 1:
            # One account (the ambient one, as a rule): nothing to rank, and a
            # start asks this every time.
            best = accounts[0]
            spec = best.spec
            # Not asked again when the gate has just found it can take a run;
            # can_take without its call for an account only a rest can stop
            # (no cap, no budget: the ambient one, as a rule) that is not resting.
            if (
                not known_open
                and not (
                    best.exhausted_until is None
                    and best.needs_login is None
                    and spec.concurrency is None
                    and spec.budget is None
                )
                and not best.can_take(now)
            ):
                return None
        else:
            # Not near its limit first, then the fewest running runs, then the
            # smallest share of its budget used, then config order (the first
            # kept). The share is worked out only to break a tie.
            best_rank: tuple[bool, int] | None = None
            best_share: float | None = None
            for account in accounts:
                if not account.can_take(now):
                    continue
                if has_last and account.spec.name == last:
                    # Near its limit or not: the conversation's session lives there.
                    return self._plain_pick(last), account
                # near() only where a warning was given: most accounts never get one.
                rank = (account.near_until is not None and account.near(now), len(account.running))
                if best is None or best_rank is None or rank < best_rank:
                    best, best_rank, best_share = account, rank, None
                elif rank == best_rank:
                    if best_share is None:
                        best_share = best.share_used(now)
                    share = account.share_used(now)
                    if share < best_share:
                        best, best_share = account, share
            if best is None:
                return None
        name = best.spec.name
        if has_last and last != name:
            return Pick(name, moved=True, moved_from=last), best
        pick = self._plain_picks.get(name)  # _plain_pick, inlined for every start
        return (pick or self._plain_pick(name)), best

    def _plain_pick(self, account: str | None) -> Pick:
        """``Pick(account)``, made once per account name: a pick is asked for every start."""
        pick = self._plain_picks.get(account)
        if pick is None:
            pick = self._plain_picks[account] = Pick(account)
        return pick

    def pin(self, run_id: str, account: str | None) -> None:
        """Start ``run_id`` on ``account`` if that account can take it when it starts.

        The simulator puts a run back on the account it was running on when
        a trace file was rotated; a pin the account cannot honour then (it
        is busy, resting or gone) is dropped and the run picked as usual.
        """
        self._pins[run_id] = account

    def _pinned(self, run_id: str, provider: str, now: float) -> tuple[Pick, AccountState] | None:
        if run_id not in self._pins:
            return None
        name = self._pins.pop(run_id)
        for held in self._accounts.get(provider, ()):  # configured ones only
            if held.spec.name == name and held.can_take(now):
                return Pick(name), held
        return None

    def gate(self, now: float) -> AccountGate:
        """A start gate for one ``take_startable`` call at ``now``."""
        return AccountGate(self, now)

    # -- events ------------------------------------------------------------

    def start(self, run_id: str, provider: str, account: str | None, now: float) -> None:
        """``run_id`` started on ``account``: it holds the account until :meth:`finish`.

        Which account the run's conversation sticks to is not changed here:
        that follows its session (:meth:`remember`), which a run may never
        report (it fails to spawn, it is cancelled first).
        """
        if run_id in self._holders:
            raise ValueError(f"run {run_id!r} already holds an account")
        held = self._find(provider, account)
        if held is None:
            raise ValueError(f"provider {provider!r} has no account {account!r}")
        self._hold(run_id, provider, held, now)

    def _hold(self, run_id: str, provider: str, held: AccountState, now: float) -> None:
        """:meth:`start` on an account already found."""
        held.begin(run_id, now)
        self._holders[run_id] = (provider, held)
        self.closed.pop(provider, None)

    def finish(
        self, run_id: str, now: float, *, spawned: bool = True, charge: Charge = NO_CHARGE
    ) -> None:
        """``run_id`` ended (any outcome): its account is free for another run.

        A run that never got a process (``spawned`` false: its program was
        missing, it was cancelled while preparing) spent nothing: its start
        is taken back from the budget. ``charge``: what it spent, for a
        ``tokens`` or ``usd`` budget.
        """
        holder = self._holders.pop(run_id, None)
        if holder is None:
            return  # a run that started before accounts were known to the book
        provider, account = holder
        account.end(run_id, now, spawned, charge)
        self.closed.pop(provider, None)
        if not account.running and self._retired.get((provider, account.spec.name)) is account:
            del self._retired[(provider, account.spec.name)]

    def exhaust(
        self,
        provider: str,
        account: str | None,
        now: float,
        resets_at: float | None,
        message: str,
    ) -> float | None:
        """The provider said ``account`` is out of quota: rest it until the reset.

        Returns the time it rests until (see :meth:`rest_until`), or None if
        the account is no longer configured.
        """
        until = self.rest_until(provider, account, now, resets_at)
        if until is not None:
            self.rest(provider, account, until, message)
        return until

    def rest_until(
        self, provider: str, account: str | None, now: float, resets_at: float | None
    ) -> float | None:
        """Until when a usage limit reported at ``now`` rests ``account``.

        The reported reset, if there is one still ahead; else the account's
        window, or :data:`DEFAULT_REST` without one. None if the account is
        no longer configured. Changes nothing.
        """
        held = self._find(provider, account)
        if held is None:
            return None
        # A reset in the past, not a number, or further ahead than any quota
        # period (a reset in milliseconds, say) is no reset time at all.
        if (
            resets_at is None
            or not math.isfinite(resets_at)
            or resets_at <= now
            or resets_at > now + MAX_REST
        ):
            return now + (held.spec.window or DEFAULT_REST)
        return resets_at

    def rest(self, provider: str, account: str | None, until: float, message: str) -> None:
        """Rest ``account`` until ``until`` (a limit just reported, or restored)."""
        held = self._find(provider, account)
        if held is not None:
            self.may_free_in_time = True
            held.exhausted_until = until
            held.message = message
            self.closed.pop(provider, None)

    def wake(self, provider: str, account: str | None) -> bool:
        """End ``account``'s rest now (an operator knows better); False if unknown.

        Its need of a login and a warning that it is near its limit end too.
        """
        held = self._find(provider, account)
        if held is None:
            return False
        held.exhausted_until = held.message = None
        held.needs_login = held.near_until = None
        self.closed.pop(provider, None)
        return True

    def charge(self, provider: str, account: str | None, end: float, charge: Charge) -> None:
        """Count ``charge``, what a run that ended at ``end`` spent, toward ``account``'s window.

        For a run whose figures were known only after its finish (the run
        itself was counted at its finish, without them).
        """
        held = self._find(provider, account)
        if held is not None:
            held.charge(end, charge)
            self.closed.pop(provider, None)

    def warn(self, provider: str, account: str | None, until: float) -> None:
        """The provider warned that ``account`` is near its limit: prefer others until ``until``.

        A later warning's reset replaces an earlier one's.
        """
        held = self._find(provider, account)
        if held is not None:
            held.near_until = until
            self.closed.pop(provider, None)

    def need_login(self, provider: str, account: str | None, message: str) -> None:
        """A run on ``account`` failed to authenticate: it takes no run until :meth:`logged_in`."""
        held = self._find(provider, account)
        if held is not None:
            held.needs_login = message
            self.closed.pop(provider, None)

    def logged_in(self) -> list[tuple[str, str | None]]:
        """Every account that needed a login may take runs again (a reload); which did."""
        cleared = []
        for provider, account, _ in self._every_account():
            if account.needs_login is not None:
                account.needs_login = None
                cleared.append((provider, account.spec.name))
                self.closed.pop(provider, None)
        return cleared

    # -- the rest of a fleet ----------------------------------------------

    def set_elsewhere(self, uses: Iterable[AccountUse]) -> None:
        """Count ``uses``, the runs other fleet members charged to accounts, from now on.

        A snapshot: it replaces the previous one whole, for every account, so
        calling it at each poll of the shared ledger never counts a run twice.
        It must not hold this book's own runs (they are counted as they
        start and end). Accounts it does not name have no usage elsewhere.
        """
        found: dict[tuple[str, str | None], list[AccountUse]] = {}
        for use in uses:
            found.setdefault(use[:2], []).append(use)
        for provider, account, _ in self._every_account():
            account.set_elsewhere(FleetUsage(found.get((provider, account.spec.name), ())))
            self.closed.pop(provider, None)

    def sync_rests(
        self, limits: Iterable[tuple[str, str | None, float, str]], now: float
    ) -> list[tuple[str, str | None, float | None]]:
        """Rest accounts exactly as ``limits`` (provider, account, until, message) say.

        ``limits`` are the rests in force in a fleet's shared ledger at
        ``now``: any member may have recorded or ended them. An account they
        do not name is not resting. Returns what changed, in config order:
        ``(provider, account, until)``, ``until`` None for a rest that ended
        before its time.
        """
        wanted = {
            (provider, account): (until, message) for provider, account, until, message in limits
        }
        changes: list[tuple[str, str | None, float | None]] = []
        for provider, account, _ in self._every_account():
            rest = wanted.get((provider, account.spec.name))
            if rest is not None:
                if (account.exhausted_until, account.message) != rest:
                    self.may_free_in_time = True
                    account.exhausted_until, account.message = rest
                    changes.append((provider, account.spec.name, rest[0]))
                    self.closed.pop(provider, None)
            elif account.exhausted_until is not None:
                if account.exhausted_until > now:
                    changes.append((provider, account.spec.name, None))
                account.exhausted_until = account.message = None
                self.closed.pop(provider, None)
        return changes

    def _every_account(self) -> list[tuple[str, AccountState, bool]]:
        """``(provider, account, retired)``: configured ones in config order, then retired ones."""
        out = [
            (provider, account, False)
            for provider, accounts in self._accounts.items()
            for account in accounts
        ]
        retired = sorted(self._retired.items(), key=lambda item: (item[0][0], item[0][1] or ""))
        out += [(provider, account, True) for (provider, _), account in retired]
        return out

    # -- restoring after a restart ----------------------------------------

    def restore_usage(
        self,
        provider: str,
        account: str | None,
        started_at: float,
        finished_at: float | None,
        charge: Charge = NO_CHARGE,
    ) -> None:
        """Count a run of an earlier process toward ``account``'s window."""
        held = self._find(provider, account)
        if held is not None:
            held.record(started_at, finished_at, charge)
            self.closed.pop(provider, None)

    def remember(self, provider: str, conversation: str, account: str | None) -> None:
        """The account ``conversation`` used last (its session lives there)."""
        self._last[(provider, conversation)] = account

    # -- queries -----------------------------------------------------------

    def holding(self, run_id: str) -> str | None:
        """The account ``run_id`` holds (None for the ambient one, or none held)."""
        holder = self._holders.get(run_id)
        return None if holder is None else holder[1].spec.name

    def next_change(self, provider: str, now: float) -> float | None:
        """When time alone may make an account of ``provider`` available again.

        With none available now, :meth:`blocked_until` (``math.inf`` there
        is None here).
        """
        times = [t for account in self._accounts.get(provider, ()) if (t := account.free_at(now))]
        return min(times) if times else None

    def blocked(self, provider: str, now: float) -> Blocked | None:
        """Why ``provider`` can start nothing now, or None if it can."""
        accounts = self._accounts.get(provider, ())
        if not accounts:
            return None
        reasons = []
        for account in accounts:
            why = account.why_not(now)
            if why is None:
                return None
            label = "the ambient account" if account.spec.name is None else account.spec.name
            reasons.append(f"{label}: {why}")
        return Blocked(provider, "; ".join(reasons), self.next_change(provider, now))

    def statuses(self, now: float) -> list[AccountStatus]:
        """Every account, configured ones in config order, then retired ones."""
        return [
            self._status(provider, account, now, retired=retired)
            for provider, account, retired in self._every_account()
        ]

    def _status(
        self, provider: str, account: AccountState, now: float, *, retired: bool
    ) -> AccountStatus:
        spec = account.spec
        why = "removed from the configuration" if retired else account.why_not(now)
        return AccountStatus(
            provider=provider,
            account=spec.name,
            running=len(account.running),
            usage=account.usage(now),
            budget=spec.budget,
            unit=spec.unit,
            window=spec.window,
            exhausted_until=account.exhausted_until,
            message=account.message,
            runs_started=account.runs_started,
            available=why is None,
            reason=why,
            retired=retired,
            running_elsewhere=0 if account.elsewhere is None else len(account.elsewhere.running),
            near_limit_until=account.near_until if account.near(now) else None,
            needs_login=account.needs_login,
        )

    def _find(self, provider: str, name: str | None) -> AccountState | None:
        for account in self._accounts.get(provider, ()):
            if account.spec.name == name:
                return account
        return self._retired.get((provider, name))


class AccountGate:
    """Lets the scheduler start a provider's run only when an account can take it.

    Each started run is given its account at once (so the next answer counts
    it); :attr:`picks` holds the decision per run id, in start order.
    """

    def __init__(self, book: AccountBook, now: float) -> None:
        self._book = book
        self._now = now
        self.picks: dict[str, Pick] = {}

    def can_start(self, provider: str) -> bool:
        """Whether some account of ``provider`` can take a run now."""
        return self._book.blocked_until(provider, self._now) is None

    def started(self, run: RunRequest) -> None:
        """Give ``run`` its account."""
        book, now, run_id, provider = self._book, self._now, run.id, run.provider
        if run_id in book._holders:
            raise ValueError(f"run {run_id!r} already holds an account")
        chosen = (book._pins and book._pinned(run_id, provider, now)) or book._choose(
            provider,
            None if run.conversation is None else sticky_key(run.workspace, run.conversation),
            now,
            known_open=True,  # can_start said yes a moment ago, with nothing in between
        )
        if chosen is None:  # a gate used against its contract, not a decision
            raise AssertionError(f"no account for {run_id} although the gate was open")
        pick, held = chosen
        book._hold(run_id, provider, held, now)
        self.picks[run_id] = pick
