"""The sans-IO budget arithmetic: one account's usage in its rolling window.

What an account spends (:class:`AccountSpec`'s ``budget`` in ``runs``,
``run_minutes``, ``tokens`` or ``usd``), counted from its starts and the runs
that ended in the window, plus what other fleet members ran on it
(each an :class:`AccountUse`).
:class:`~herdsman.core.accounts.AccountBook` keeps one
``AccountState`` per configured account and picks among them; docs/accounts.md
has the model. No clock, no I/O: every call takes ``now``.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple

import attrs

__all__ = [
    "NO_CHARGE",
    "AccountSpec",
    "AccountState",
    "AccountUse",
    "BudgetUnit",
    "Charge",
    "FleetUsage",
    "amount_text",
    "leaves_window",
    "spent_with_estimate",
]

BudgetUnit = Literal["runs", "run_minutes", "tokens", "usd"]


@attrs.frozen
class AccountSpec:
    """One account as configured. ``name`` ``None`` is the ambient environment."""

    name: str | None
    window: float | None = None
    #: Runs, run-minutes or tokens (whole numbers), or US dollars, per window.
    budget: float | None = None
    unit: BudgetUnit = "runs"
    concurrency: int | None = None


@attrs.frozen
class Charge:
    """What one attempt spent, as a ``tokens`` or ``usd`` budget counts it.

    ``tokens``: the tokens the budget counts (``None``: the stream stated no
    counts); ``usd``: the provider's cost (``None``: none stated). A run
    without a figure counts as nothing, and stays out of the mean that
    running runs are estimated at.
    """

    tokens: int | None = None
    usd: float | None = None


#: What an attempt that stated nothing spent.
NO_CHARGE = Charge()


def amount_text(amount: float, unit: BudgetUnit) -> str:
    """``12 runs``, ``300 run-minutes``, ``5,000,000 tokens``, ``$20.00``: an amount in its unit."""
    if unit == "usd":
        return f"${amount:,.2f}"
    label = {"runs": "runs", "run_minutes": "run-minutes", "tokens": "tokens"}[unit]
    return f"{amount:,.{0 if float(amount).is_integer() else 1}f} {label}"


class AccountUse(NamedTuple):
    """One run (or earlier attempt) charged to an account: its start, and its end if it ended.

    What re-counts a quota window: the ledger's ``account_usage`` after a
    restart, and another fleet member's runs at every poll
    (each an :class:`AccountUse`). ``finished_at`` is None while it runs; a run that
    spent no run-minutes (lost) ends when it started. ``tokens`` and
    ``usd``: what it spent, as :class:`Charge` counts it (None: not stated,
    or still running). A tuple: a poll hands over thousands.
    """

    provider: str
    account: str
    started_at: float
    finished_at: float | None
    tokens: int | None = None
    usd: float | None = None


class _Ended:
    """Runs that ended in a window, by end: their run time, tokens and dollars, summed.

    Kept apart from the starts so that a reload may change an account's unit
    and find every figure there.
    """

    __slots__ = ("entries", "seconds", "tokens", "tokens_runs", "usd", "usd_runs")

    def __init__(self) -> None:
        # (end, seconds, tokens, usd), in end order.
        self.entries: deque[tuple[float, float, int | None, float | None]] = deque()
        self.seconds = 0.0
        self.tokens = 0
        self.usd = 0.0
        # How many ended runs stated the figure (the mean's divisor).
        self.tokens_runs = 0
        self.usd_runs = 0

    def add(self, end: float, seconds: float, charge: Charge) -> None:
        """A run that ended at ``end``, kept in end order.

        Runs end in order as they happen; runs restored after a restart come
        in start order, and a long one must not hold shorter ones in the
        window past their time.
        """
        tokens, usd = charge.tokens, charge.usd
        entries = self.entries
        if not entries or entries[-1][0] <= end:
            entries.append((end, seconds, tokens, usd))
        else:
            # Ties on end time sort by the rest, whatever they are: None never compares.
            insort(entries, (end, seconds, tokens, usd), key=lambda entry: entry[0])
        self.seconds += seconds
        if tokens is not None:
            self.tokens += tokens
            self.tokens_runs += 1
        if usd is not None:
            self.usd += usd
            self.usd_runs += 1

    def expire(self, horizon: float) -> None:
        """Drop the runs that ended at or before ``horizon``."""
        entries = self.entries
        while entries and entries[0][0] <= horizon:
            _, seconds, tokens, usd = entries.popleft()
            self.seconds -= seconds
            if tokens is not None:
                self.tokens -= tokens
                self.tokens_runs -= 1
            if usd is not None:
                self.usd -= usd
                self.usd_runs -= 1
        if not entries:  # no float drift left over
            self.seconds = self.usd = 0.0

    def spent(self, unit: BudgetUnit) -> tuple[float, int]:
        """What the runs spent in ``unit`` (tokens or usd), and how many stated it."""
        if unit == "tokens":
            return float(self.tokens), self.tokens_runs
        return self.usd, self.usd_runs


def spent_with_estimate(total: float, stated: int, running: int) -> float:
    """A ``tokens`` or ``usd`` budget's usage: ended runs' spend, each running run at their mean.

    ``total`` is what the runs that ended in the window spent, ``stated``
    how many of them stated the figure, ``running`` how many runs run. A
    run's spend is known only at its end. Counting a running run as nothing
    would let an account start run after run while the first ones have not
    ended; counting it at the mean of the runs that ended in the window
    holds the budget as well as what is known allows. With no such run
    yet, a running run counts nothing. The fleet's claims count the same.
    """
    if running and stated:
        return total + running * (total / stated)
    return total


def _spent_with_estimate(unit: BudgetUnit, ended: Sequence[_Ended], running: int) -> float:
    """:func:`spent_with_estimate` over this member's and other members' ended runs."""
    total, stated = 0.0, 0
    for part in ended:
        spent, runs = part.spent(unit)
        total += spent
        stated += runs
    return spent_with_estimate(total, stated, running)


#: ``AccountState._used_at`` when nothing is remembered: no moment is at or after it.
_FORGOTTEN = math.inf


class AccountState:
    """One configured account: its spec, its runs, its usage in the window, and its rest.

    Its usage is asked several times per start (can it take a run, how much of
    its budget is used, when time frees it), so it is remembered (:meth:`used`)
    until something it counts changes: every change to the runs, the spec or
    the usage elsewhere goes through a method here that forgets it.
    """

    __slots__ = (
        "_leaves",
        "_oldest",
        "_used",
        "_used_at",
        "_used_last",
        "elsewhere",
        "ended",
        "exhausted_until",
        "message",
        "near_until",
        "needs_login",
        "running",
        "runs_started",
        "spec",
        "starts",
    )

    def __init__(self, spec: AccountSpec) -> None:
        self.spec = spec
        self.running: dict[str, float] = {}  # run id -> start time
        # Start times in the window, oldest first (only with a window).
        self.starts: deque[float] = deque()
        # Runs that ended in the window (only with a window).
        self.ended = _Ended()
        self.exhausted_until: float | None = None
        self.message: str | None = None
        # Near its limit until then (a provider's warning); None: no warning.
        self.near_until: float | None = None
        # What a run met that said the account is not logged in; None: it is.
        self.needs_login: str | None = None
        self.runs_started = 0
        # Other fleet members' usage (None outside a fleet): replaced whole at each poll.
        self.elsewhere: FleetUsage | None = None
        # used(): the usage last worked out, at _used_at; it holds up to _used_last
        # and before _leaves, the moment _oldest, the oldest use counted, leaves
        # the window (leaves_window). Both kept exact while it holds:
        # blocked_until reads _leaves.
        self._used = 0.0
        self._used_at = _FORGOTTEN
        self._used_last = math.inf
        self._oldest = math.inf
        self._leaves = math.inf

    # -- changes (each forgets the usage remembered) -------------------------

    def configure(self, spec: AccountSpec) -> None:
        """New limits (a reload): its window, budget and unit may change what counts."""
        self.spec = spec
        self._used_at = _FORGOTTEN

    def set_elsewhere(self, elsewhere: FleetUsage | None) -> None:
        """Other fleet members' runs on the account, as the last poll saw them."""
        self.elsewhere = elsewhere
        self._used_at = _FORGOTTEN

    def begin(self, run_id: str, now: float) -> None:
        """``run_id`` started on the account at ``now``.

        A ``runs`` budget's usage remembered at ``now`` is one more start,
        the newest (the last to leave the window): it is counted in, not
        forgotten. Any other unit's usage counts running runs in its own
        way, and is worked out again.
        """
        self.running[run_id] = now
        self.runs_started += 1
        spec = self.spec
        window = spec.window
        if window is None:
            if spec.unit != "runs":  # a runs budget counts nothing without a window
                self._used_at = _FORGOTTEN
            return
        if spec.unit == "runs" and self._used_at <= now <= self._used_last and now < self._leaves:
            # What used() remembered holds (its own test), so nothing has left
            # the window since either: the new start is simply one more.
            self.starts.append(now)
            self._used += 1.0
            self._used_at = now
            if now < self._oldest:  # none counted before it (or only later ones)
                self._oldest = now
                self._leaves = leaves_window(now, window)
        else:
            self._expire(now)
            self.starts.append(now)
            self._used_at = _FORGOTTEN

    def end(self, run_id: str, now: float, spawned: bool, charge: Charge) -> None:
        """``run_id`` ended at ``now``; never spawned, its start is taken back.

        A ``runs`` budget counts starts only: a run that did spawn leaves its
        usage as it was, and what is remembered holds.
        """
        start = self.running.pop(run_id)
        if not spawned:
            self.runs_started -= 1
            if start in self.starts:
                self.starts.remove(start)
        elif self.spec.window is not None:
            self.ended.add(now, max(0.0, now - start), charge)
            if self.spec.unit == "runs":
                return
        elif self.spec.unit == "runs":
            return
        self._used_at = _FORGOTTEN

    def charge(self, end: float, charge: Charge) -> None:
        """What a run that ended at ``end`` spent, known after its end was counted."""
        if self.spec.window is not None:
            self.ended.add(end, 0.0, charge)
            self._used_at = _FORGOTTEN

    def record(self, start: float, end: float | None, charge: Charge = NO_CHARGE) -> None:
        """Count a run's usage (``end`` None: the run is still running)."""
        if self.spec.window is None:
            return
        insort(self.starts, start)
        if end is not None:
            self.ended.add(end, max(0.0, end - start), charge)
        self._used_at = _FORGOTTEN

    # -- usage -----------------------------------------------------------------

    def _expire(self, now: float) -> None:
        window = self.spec.window
        if window is None:
            return
        _expire(self.starts, self.ended, now - window)

    def usage(self, now: float) -> float:
        """Usage in the current window, in the account's unit (the fleet's, in a fleet)."""
        window = self.spec.window
        unit = self.spec.unit
        if window is None:
            if unit == "runs":
                # Starts are counted only in a window: any left here are from
                # before a reload took the window away.
                return 0.0
            horizon = -math.inf
            elsewhere = None  # nothing is counted without a window, here or elsewhere
        else:
            horizon = now - window
            _expire(self.starts, self.ended, horizon)
            elsewhere = self.elsewhere
        if unit == "runs":
            if elsewhere is None:
                return float(len(self.starts))
            return float(len(self.starts) + elsewhere.starts_after(horizon))
        if unit != "run_minutes":
            if elsewhere is None:
                return _spent_with_estimate(unit, (self.ended,), len(self.running))
            elsewhere.expire(horizon)
            return _spent_with_estimate(
                unit, (self.ended, elsewhere.ended), len(self.running) + len(elsewhere.running)
            )
        seconds = self.ended.seconds + sum(
            now - max(start, horizon) for start in self.running.values()
        )
        if elsewhere is not None:
            seconds += elsewhere.seconds_at(now, horizon)
        return seconds / 60.0

    def used(self, now: float) -> float:
        """:meth:`usage` at ``now``, worked out again only when it may differ from the last.

        What was worked out holds while nothing it counts changed (each change
        forgets it), ``now`` is not before the moment it was worked out, and
        nothing it counts has left the window since: ``now`` is before the
        moment the oldest use leaves it (:func:`leaves_window`, exact for the
        comparison :func:`_expire` makes). Minutes of running runs grow with
        time, so with any, it holds only at the very moment it was worked out.
        """
        if self._used_at <= now <= self._used_last and now < self._leaves:
            return self._used
        used = self.usage(now)
        spec = self.spec
        elsewhere = self.elsewhere
        growing = spec.unit == "run_minutes" and bool(
            self.running or (elsewhere is not None and elsewhere.running)
        )
        self._used, self._used_at = used, now
        self._used_last = now if growing else math.inf
        self._oldest = oldest = self._oldest_counted()
        window = spec.window
        self._leaves = (
            math.inf if window is None or oldest == math.inf else leaves_window(oldest, window)
        )
        return used

    def _oldest_counted(self) -> float:
        """The oldest use the unit counts (here or elsewhere), the first to leave the window.

        A ``runs`` budget counts starts, every other unit ends: the other
        kind leaving the window changes nothing it counts. ``math.inf``:
        none.
        """
        runs = self.spec.unit == "runs"
        oldest = math.inf
        sources: tuple[AccountState | FleetUsage, ...] = (
            (self,) if self.elsewhere is None else (self, self.elsewhere)
        )
        for source in sources:
            if runs:
                if source.starts and source.starts[0] < oldest:
                    oldest = source.starts[0]
            elif source.ended.entries and source.ended.entries[0][0] < oldest:
                oldest = source.ended.entries[0][0]
        return oldest

    def oldest_use(self) -> float | None:
        """When the oldest usage counted toward the budget happened: a start, or an end.

        Call after :meth:`usage` at the same time, which drops what left the window.
        """
        oldest = self._oldest_counted()
        return None if oldest == math.inf else oldest

    def can_take(self, now: float) -> bool:
        """Whether the account can take a run now: :meth:`why_not` is None, without its words.

        Asked for every account before every start, on the usage remembered
        (:meth:`used`); the property tests hold it to :meth:`why_not`.
        """
        until = self.exhausted_until
        if until is not None:
            if until > now:
                return False
            self.exhausted_until = self.message = None
        if self.needs_login is not None:
            return False
        spec = self.spec
        if spec.concurrency is not None and len(self.running) >= spec.concurrency:
            return False
        return spec.budget is None or self.used(now) < spec.budget

    def blocked_until(self, now: float) -> float | None:
        """None if the account can take a run now (:meth:`can_take`); else until when it cannot.

        That is :meth:`free_at`, or ``math.inf`` where time alone never frees
        it. One pass over its state for the book's gate, which asks both of
        every account of a provider none of whose accounts can take a run:
        the usage over the window is read once, not once for each question
        (the property tests hold it to the two).
        """
        until = self.exhausted_until
        if until is not None and until <= now:
            self.exhausted_until = self.message = until = None
        if self.needs_login is not None:
            return math.inf  # only a reload, or an end of its rest, frees it
        spec = self.spec
        if spec.concurrency is not None and len(self.running) >= spec.concurrency:
            return math.inf  # as free_at says: only an end of one of its runs (or a reload)
        budget = spec.budget
        spent = budget is not None and self.used(now) >= budget
        if until is None and not spent:
            return None
        window = spec.window
        if spent and window is not None:
            # The oldest usage leaving the window is the first chance to drop
            # below the budget; a spurious wake-up then is harmless. used()
            # has just found when (math.inf: only running runs use it up,
            # and their end will tell; another member's, at the poll that
            # sees it end).
            leaves = self._leaves
            return leaves if until is None or leaves > until else until
        return math.inf if until is None else until

    def why_not(self, now: float) -> str | None:
        """Why the account cannot take a run now, or None if it can (for status views)."""
        if self.exhausted_until is not None:
            if self.exhausted_until > now:
                return "usage limit reached"
            self.exhausted_until = self.message = None
        if self.needs_login is not None:
            return f"needs login ({self.needs_login})"
        spec = self.spec
        if spec.concurrency is not None and len(self.running) >= spec.concurrency:
            return f"at its concurrency cap ({spec.concurrency})"
        if spec.budget is not None and self.usage(now) >= spec.budget:
            return f"budget of {amount_text(spec.budget, spec.unit)} per window spent"
        return None

    def near(self, now: float) -> bool:
        """Whether a provider's warning that the account is near its limit still holds."""
        until = self.near_until
        if until is None:
            return False
        if until > now:
            return True
        self.near_until = None
        return False

    def share_used(self, now: float) -> float:
        budget = self.spec.budget
        return 0.0 if budget is None else self.used(now) / budget

    def free_at(self, now: float) -> float | None:
        """When time alone lifts what blocks the account (None: time alone never does).

        Its own runs filling its ``concurrency``, time alone never does,
        whatever its rest or budget: only one of them ending (or a reload)
        does. The moment its rest ends or a use leaves its window would wake
        a dispatcher for nothing, and would make the book's remembered
        answer (``closed``) later than one worked out afresh once running
        runs' minutes spent the budget meanwhile.
        """
        if self.needs_login is not None:
            return None  # only a reload, or an end of its rest, does
        spec = self.spec
        if spec.concurrency is not None and len(self.running) >= spec.concurrency:
            return None
        times: list[float] = []
        if self.exhausted_until is not None and self.exhausted_until > now:
            times.append(self.exhausted_until)
        if spec.budget is not None and spec.window is not None and self.used(now) >= spec.budget:
            # The oldest usage leaving the window is the first chance to drop
            # below the budget; a spurious wake-up then is harmless.
            oldest = self.oldest_use()
            if oldest is None:
                # Only running runs use it up: their end will tell (another
                # member's, at the poll that sees it end).
                return None
            times.append(leaves_window(oldest, spec.window))
        if not times:
            return None
        return max(times)


def leaves_window(at: float, window: float) -> float:
    """The first moment a use at ``at`` is out of a ``window`` rolling back from it.

    ``at + window``, made exact for the test :func:`_expire` makes (a use
    leaves once ``now - window >= at``, in floating point), so that an
    account blocked until then is never free a moment sooner.
    """
    moment = at + window
    while moment - window >= at:
        moment = math.nextafter(moment, -math.inf)
    while moment - window < at:
        moment = math.nextafter(moment, math.inf)
    return moment


def _expire(starts: deque[float], ended: _Ended, horizon: float) -> None:
    """Drop usage at or before ``horizon``."""
    while starts and starts[0] <= horizon:
        starts.popleft()
    ended.expire(horizon)


class FleetUsage:
    """Other fleet members' runs on one account, as the last poll of the ledger saw them."""

    __slots__ = ("ended", "running", "starts")

    def __init__(self, uses: Iterable[AccountUse]) -> None:
        starts: list[float] = []
        ended: list[tuple[float, float, Charge]] = []
        self.running: list[float] = []  # start times of runs still running
        for _, _, start, end, tokens, usd in uses:
            starts.append(start)
            if end is None:
                self.running.append(start)
            else:
                ended.append((end, max(0.0, end - start), Charge(tokens, usd)))
        # Sorted, so the same snapshot counts the same whatever order it came in.
        self.starts = deque(sorted(starts))
        self.ended = _Ended()
        ended.sort(key=lambda entry: (entry[0], entry[1]))
        for end, seconds, charge in ended:
            self.ended.add(end, seconds, charge)

    def starts_after(self, horizon: float) -> int:
        """Runs started after ``horizon`` (in the window)."""
        _expire(self.starts, self.ended, horizon)
        return len(self.starts)

    def expire(self, horizon: float) -> None:
        """Drop what is no longer in the window that reaches back to ``horizon``."""
        _expire(self.starts, self.ended, horizon)

    def seconds_at(self, now: float, horizon: float) -> float:
        """Seconds of runs that ended after ``horizon``, plus those running have run so far."""
        _expire(self.starts, self.ended, horizon)
        return self.ended.seconds + sum(now - max(start, horizon) for start in self.running)
