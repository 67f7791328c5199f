"""What the account book remembers between asks never changes a decision.

The book keeps each account's usage (``AccountState.used``) and, per provider,
that none of its accounts can take a run and until when
(``AccountBook.blocked_until``), and forgets them at every change to the
accounts. The reference here is a book that remembers nothing: a new one,
given the same changes from the start, asked once. The book under test is
asked after every step, so that it has something remembered when the next
change comes; any change that failed to forget would show as a different
answer. One answer may differ, in one direction: until when a provider can
take nothing. Remembered, it is the first moment time alone may free an
account, as worked out when it was asked; a fresh book asked later may name
a later one (the oldest use left the window during a rest and a later use
keeps the budget spent, running runs' minutes spent the budget meanwhile,
or a cheap ended run leaving raised a spend budget's estimate of its
running runs), never an earlier one: the dispatcher
wakes for nothing at the remembered moment and asks again, and never
sleeps past a moment an account frees.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from herdsman.core import RunRequest
from herdsman.core.accounts import (
    AccountBook,
    AccountGate,
    AccountSpec,
    AccountStatus,
    AccountUse,
    Charge,
)

HOUR = 3600.0
T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock
PROVIDERS = ("p", "q")
ACCOUNTS = ("a", "b")
CONVERSATIONS = (None, "c0", "c1")

spec_st = st.builds(
    AccountSpec,
    name=st.just("placeholder"),
    window=st.sampled_from((None, 600.0, HOUR)),
    budget=st.sampled_from((None, 1, 2, 3)),
    unit=st.sampled_from(("runs", "run_minutes", "tokens", "usd")),
    concurrency=st.sampled_from((None, 1, 2)),
)
charge_st = st.builds(
    Charge,
    tokens=st.sampled_from((None, 0, 1, 2)),
    usd=st.sampled_from((None, 0.5, 1.0)),
)

#: One change to a book, replayed on a new book for the reference.
Change = Callable[[AccountBook], object]


class RememberingBook(RuleBasedStateMachine):
    """Random changes to a book asked after each; the answers of one that remembers nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.book = AccountBook()
        self.changes: list[Change] = []
        self.running: dict[str, str] = {}  # run id -> provider
        self.ended: list[tuple[str, str | None, float]] = []  # provider, account, end
        # Each account's window, once it had one: reloads never widen it.
        self.windows: dict[tuple[str, str], float | None] = {}
        self.next_id = 0

    def apply(self, change: Change) -> None:
        self.changes.append(change)
        change(self.book)

    def configure(self, provider: str, specs: list[AccountSpec]) -> None:
        named = []
        for name, spec in zip(ACCOUNTS, specs, strict=False):
            window = spec.window
            old = self.windows.get((provider, name))
            if old is not None and (window is None or window > old):
                # Usage leaves the window as it is read, so a reload that widens
                # a window finds what earlier asks left: not this test's business.
                window = old
            self.windows[provider, name] = window
            budget = spec.budget if window else None
            named.append(AccountSpec(name, window, budget, spec.unit, spec.concurrency))
        self.apply(lambda book: book.configure(provider, named))

    @initialize(p=st.lists(spec_st, max_size=2), q=st.lists(spec_st, max_size=2))
    def setup(self, p: list[AccountSpec], q: list[AccountSpec]) -> None:
        self.configure("p", p)
        self.configure("q", q)

    @rule(provider=st.sampled_from(PROVIDERS), specs=st.lists(spec_st, max_size=2))
    def reload(self, provider: str, specs: list[AccountSpec]) -> None:
        self.configure(provider, specs)

    @rule(provider=st.sampled_from(PROVIDERS), conversation=st.sampled_from(CONVERSATIONS))
    def start(self, provider: str, conversation: str | None) -> None:
        now, run = self.now, RunRequest(f"r{self.next_id}", provider, conversation)
        if not AccountGate(self.book, now).can_start(provider):
            return
        self.next_id += 1
        self.running[run.id] = provider

        def started(book: AccountBook) -> None:
            AccountGate(book, now).started(run)

        self.apply(started)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), spawned=st.booleans(), charge=charge_st)
    def finish(self, data: st.DataObject, spawned: bool, charge: Charge) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.running)))
        provider, now = self.running.pop(run_id), self.now
        self.ended.append((provider, self.book.holding(run_id), now))
        self.apply(lambda book: book.finish(run_id, now, spawned=spawned, charge=charge))

    @precondition(lambda self: self.ended)
    @rule(data=st.data(), charge=charge_st)
    def charge_later(self, data: st.DataObject, charge: Charge) -> None:
        provider, account, end = data.draw(st.sampled_from(self.ended))
        self.apply(lambda book: book.charge(provider, account, end, charge))

    @rule(
        provider=st.sampled_from(PROVIDERS),
        account=st.sampled_from((None, *ACCOUNTS)),
        resets_in=st.sampled_from((None, 30.0, 900.0)),
    )
    def exhaust(self, provider: str, account: str | None, resets_in: float | None) -> None:
        now = self.now
        resets_at = None if resets_in is None else now + resets_in
        self.apply(lambda book: book.exhaust(provider, account, now, resets_at, "limit"))

    @rule(provider=st.sampled_from(PROVIDERS), account=st.sampled_from((None, *ACCOUNTS)))
    def wake(self, provider: str, account: str | None) -> None:
        self.apply(lambda book: book.wake(provider, account))

    @rule(provider=st.sampled_from(PROVIDERS), account=st.sampled_from((None, *ACCOUNTS)))
    def warn(self, provider: str, account: str | None) -> None:
        until = self.now + 300.0
        self.apply(lambda book: book.warn(provider, account, until))

    @rule(provider=st.sampled_from(PROVIDERS), account=st.sampled_from((None, *ACCOUNTS)))
    def need_login(self, provider: str, account: str | None) -> None:
        self.apply(lambda book: book.need_login(provider, account, "not logged in"))

    @rule()
    def logged_in(self) -> None:
        self.apply(lambda book: book.logged_in())

    @rule(
        uses=st.lists(
            st.tuples(
                st.sampled_from(PROVIDERS),
                st.sampled_from(ACCOUNTS),
                st.sampled_from((-700.0, -60.0, -1.0)),
                st.sampled_from((None, -30.0, 0.0)),
            ),
            max_size=3,
        )
    )
    def elsewhere(self, uses: list[tuple[str, str, float, float | None]]) -> None:
        now = self.now
        snapshot = [
            AccountUse(p, a, now + start, None if end is None else now + max(start, end), 1, 1.0)
            for p, a, start, end in uses
        ]
        self.apply(lambda book: book.set_elsewhere(snapshot))

    @rule(
        rests=st.lists(
            st.tuples(
                st.sampled_from(PROVIDERS),
                st.sampled_from((None, *ACCOUNTS)),
                st.sampled_from((-5.0, 60.0, 900.0)),
            ),
            max_size=2,
            unique_by=lambda rest: rest[:2],
        )
    )
    def sync_rests(self, rests: list[tuple[str, str | None, float]]) -> None:
        now = self.now
        limits = [(p, a, now + until, "limit") for p, a, until in rests]
        self.apply(lambda book: book.sync_rests(limits, now))

    @rule(
        provider=st.sampled_from(PROVIDERS),
        account=st.sampled_from((None, *ACCOUNTS)),
        started=st.sampled_from((-900.0, -30.0)),
        ended=st.booleans(),
        charge=charge_st,
    )
    def restore_usage(
        self, provider: str, account: str | None, started: float, ended: bool, charge: Charge
    ) -> None:
        now = self.now
        finished = now - 10.0 if ended else None
        self.apply(
            lambda book: book.restore_usage(provider, account, now + started, finished, charge)
        )

    @rule(seconds=st.sampled_from((1.0, 30.0, 300.0, 600.0, HOUR)))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @rule(provider=st.sampled_from(PROVIDERS))
    def wait_for_the_next_change(self, provider: str) -> None:
        """Step to the very moment the book says time frees an account: the boundary."""
        until = self.book.blocked_until(provider, self.now)
        if until is not None and until != float("inf"):
            self.now = until

    @invariant()
    def answers_as_a_book_that_remembers_nothing(self) -> None:
        fresh = AccountBook()
        for change in self.changes:
            change(fresh)
        now = self.now
        for provider in PROVIDERS:
            for book in (self.book, fresh):
                # Asked twice, as a dispatch asks: the second answer is the remembered one.
                book.blocked_until(provider, now)
            remembered = self.book.blocked_until(provider, now)
            afresh = fresh.blocked_until(provider, now)
            assert (remembered is None) == (afresh is None), (remembered, afresh)
            assert remembered is None or afresh is None or remembered <= afresh
            assert self.book.available(provider, now) == fresh.available(provider, now)
            assert self.book.next_change(provider, now) == fresh.next_change(provider, now)
            for conversation in CONVERSATIONS:
                assert self.book.pick(provider, conversation, now) == fresh.pick(
                    provider, conversation, now
                )
        statuses = fresh.statuses(now)
        assert over_rests_cleared(self.book.statuses(now), now) == over_rests_cleared(statuses, now)
        for provider in PROVIDERS:
            # The documented ranking, from the statuses: not near its limit,
            # fewest running, smallest share of its budget used, config order.
            configured = [s for s in statuses if s.provider == provider and not s.retired]
            ranks = [
                (
                    s.near_limit_until is not None,
                    s.running,
                    s.usage / s.budget if s.budget else 0.0,
                    i,
                )
                for i, s in enumerate(configured)
                if s.available
            ]
            pick = self.book.pick(provider, None, now)
            expected = configured[min(ranks)[-1]].account if ranks else None
            assert (pick is None) == (not ranks)
            assert pick is None or pick.account == expected


def over_rests_cleared(statuses: list[AccountStatus], now: float) -> list[AccountStatus]:
    """``statuses`` with every rest that is over cleared.

    An ask of an account clears a rest that is over (a retired account's
    status shows it until then), so a book that was asked shows less of
    them than one that never was; either way the rest is over.
    """
    return [
        attrs.evolve(s, exhausted_until=None, message=None)
        if s.exhausted_until is not None and s.exhausted_until <= now
        else s
        for s in statuses
    ]


RememberingBook.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None, report_multiple_bugs=False
)
TestRememberingBook = RememberingBook.TestCase


def test_blocked_until_is_the_first_moment_an_account_is_free() -> None:
    """Blocked by its budget, a provider is free exactly when the oldest start leaves the window."""
    book = AccountBook({"p": [AccountSpec("a", window=HOUR, budget=1)]})
    book.start("r1", "p", "a", T0)
    book.finish("r1", T0 + 10)
    until = book.blocked_until("p", T0 + 20)
    assert until == T0 + HOUR
    assert book.blocked_until("p", until - 1) == until  # remembered, and still so
    assert book.blocked_until("p", until) is None
    assert book.available("p", until)


def test_a_full_account_whose_running_run_spends_its_minutes_waits_for_an_end() -> None:
    """Found by the machine above: a full account is closed until an end, remembered or not.

    Its one slot is taken, so it is closed until the run ends (``math.inf``).
    Minutes later the running run has spent the budget: a book asked afresh
    then used to name the moment the restored use leaves the window, a
    wake-up that frees nothing (the slot is still taken), and earlier than
    the remembered answer, which the machine above forbids.
    """
    spec = AccountSpec("a", window=600.0, budget=1, unit="run_minutes", concurrency=1)

    def changes(book: AccountBook) -> None:
        book.configure("p", [spec])
        AccountGate(book, T0).started(RunRequest("r0", "p"))
        book.restore_usage("p", "a", T0 - 30.0, T0 - 10.0, Charge())

    remembering, fresh = AccountBook(), AccountBook()
    changes(remembering)
    assert remembering.blocked_until("p", T0) == math.inf
    changes(fresh)
    later = T0 + 300.0
    assert fresh.blocked_until("p", later) == math.inf
    assert remembering.blocked_until("p", later) == math.inf
    assert fresh.next_change("p", later) is None
