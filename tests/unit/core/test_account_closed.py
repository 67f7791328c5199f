"""The book's account-side signal (``AccountBook.closed``) against a recomputation from scratch.

A dispatcher skips a provider the signal names closed at ``now`` without
asking the book (``Lifecycle.take_starts``, ``next_wakeup`` and the account
gate do), so after every step of random starts, ends, rests, wake-ups,
logins, warnings, charges, fleet usage, restored usage, reloads and time,
every provider the signal names closed at ``now`` must have no account that
can take a run, worked out afresh from each account's own state
(``AccountBook.statuses``, which never reads the signal), and a pick must
agree with it. Time also jumps to
just before and to the very moment a closed provider's ``until``, where the
signal must still hold, then stop holding.
"""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from herdsman.core import RunRequest
from herdsman.core.accounts import AccountBook, AccountSpec, AccountUse, Charge, conversation_of

T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock
PROVIDERS = ("p", "q")
ACCOUNTS = ("a", "b")
CONVERSATIONS = (None, "c0", "c1")

spec_st = st.builds(
    AccountSpec,
    name=st.just("placeholder"),
    window=st.sampled_from((None, 600.0, 3600.0)),
    budget=st.sampled_from((None, 1, 2, 5)),
    unit=st.sampled_from(("runs", "run_minutes", "tokens")),
    concurrency=st.sampled_from((None, 1, 2)),
)
account_st = st.sampled_from((None, *ACCOUNTS))
provider_st = st.sampled_from(PROVIDERS)


def open_afresh(book: AccountBook, provider: str, now: float) -> bool:
    """Whether some configured account of ``provider`` can take a run, from its own state."""
    return any(
        status.available
        for status in book.statuses(now)
        if status.provider == provider and not status.retired
    )


class ClosedSignalMachine(RuleBasedStateMachine):
    """Random account-side events and time; the signal must agree with a fresh look."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.book = AccountBook()
        self.running: dict[str, str] = {}  # run id -> provider
        self.next_id = 0

    def configure(self, provider: str, specs: list[AccountSpec]) -> None:
        named = [
            AccountSpec(
                name, s.window, s.budget if s.window is not None else None, s.unit, s.concurrency
            )
            for name, s in zip(ACCOUNTS, specs, strict=False)
        ]
        self.book.configure(provider, named)

    @initialize(p=st.lists(spec_st, max_size=2), q=st.lists(spec_st, max_size=2))
    def setup(self, p: list[AccountSpec], q: list[AccountSpec]) -> None:
        self.configure("p", p)
        self.configure("q", q)

    @rule(provider=provider_st, conversation=st.sampled_from(CONVERSATIONS))
    def start(self, provider: str, conversation: str | None) -> None:
        """A start through the gate, as the scheduler makes one; it agrees with a fresh look."""
        gate = self.book.gate(self.now)
        can = gate.can_start(provider)
        assert can == open_afresh(self.book, provider, self.now)
        if can:
            run = RunRequest(f"r{self.next_id}", provider, conversation=conversation)
            self.next_id += 1
            # The gate takes what can_start found for granted; its pick is the book's.
            picked = self.book.pick(provider, conversation_of(run), self.now)
            gate.started(run)
            assert gate.picks[run.id] == picked
            self.running[run.id] = provider

    @rule(provider=provider_st)
    def ask(self, provider: str) -> None:
        """What a dispatcher asks: it records the provider closed when it is."""
        until = self.book.blocked_until(provider, self.now)
        assert (until is None) == open_afresh(self.book, provider, self.now)
        # Until when: the first moment time alone frees an account, worked
        # out afresh from each account's own state (why_not, free_at).
        blocked = self.book.blocked(provider, self.now)
        assert (until is None) == (blocked is None)
        if blocked is not None:
            expected = math.inf if blocked.until is None else blocked.until
            assert until == expected, f"{provider} at {self.now}: until {until}, not {expected}"

    @precondition(lambda self: self.running)
    @rule(data=st.data(), spawned=st.booleans(), tokens=st.sampled_from((None, 1, 3)))
    def finish(self, data: st.DataObject, spawned: bool, tokens: int | None) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.running)))
        del self.running[run_id]
        self.book.finish(run_id, self.now, spawned=spawned, charge=Charge(tokens, None))

    @rule(provider=provider_st, account=account_st, resets_in=st.sampled_from((None, 30.0, 900.0)))
    def exhaust(self, provider: str, account: str | None, resets_in: float | None) -> None:
        resets_at = None if resets_in is None else self.now + resets_in
        self.book.exhaust(provider, account, self.now, resets_at, "limit")

    @rule(provider=provider_st, account=account_st)
    def wake(self, provider: str, account: str | None) -> None:
        self.book.wake(provider, account)

    @rule(provider=provider_st, account=account_st)
    def need_login(self, provider: str, account: str | None) -> None:
        self.book.need_login(provider, account, "401")

    @rule()
    def logged_in(self) -> None:
        self.book.logged_in()

    @rule(provider=provider_st, account=account_st, seconds=st.sampled_from((60.0, 900.0)))
    def warn(self, provider: str, account: str | None, seconds: float) -> None:
        self.book.warn(provider, account, self.now + seconds)

    @rule(provider=provider_st, account=account_st, tokens=st.sampled_from((1, 4)))
    def charge(self, provider: str, account: str | None, tokens: int) -> None:
        self.book.charge(provider, account, self.now, Charge(tokens, None))

    @rule(
        uses=st.lists(
            st.tuples(
                provider_st,
                st.sampled_from(ACCOUNTS),
                st.sampled_from((-300.0, -30.0)),
                st.booleans(),
            ),
            max_size=3,
        )
    )
    def elsewhere(self, uses: list[tuple[str, str, float, bool]]) -> None:
        """A fleet poll: other members' runs on the accounts, a snapshot replacing the last."""
        self.book.set_elsewhere(
            AccountUse(provider, account, self.now + ago, None if running else self.now, 1)
            for provider, account, ago, running in uses
        )

    @rule(provider=provider_st, account=account_st, ago=st.sampled_from((-1200.0, -60.0)))
    def restore(self, provider: str, account: str | None, ago: float) -> None:
        self.book.restore_usage(provider, account, self.now + ago, self.now + ago / 2)

    @rule(provider=provider_st, specs=st.lists(spec_st, max_size=2))
    def reload(self, provider: str, specs: list[AccountSpec]) -> None:
        self.configure(provider, specs)

    @rule(seconds=st.sampled_from((1.0, 59.0, 600.0, 3600.0)))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: any(u != math.inf for _, u in self.book.closed.values()))
    @rule(provider=provider_st, at_it=st.booleans())
    def to_the_edge(self, provider: str, at_it: bool) -> None:
        """Just before a closed provider's ``until`` (closed still), or at it (asked afresh)."""
        known = self.book.closed.get(provider)
        if known is None or known[1] == math.inf or known[1] <= self.now:
            return
        until = known[1]
        self.now = until if at_it else max(self.now, math.nextafter(until, -math.inf))

    @invariant()
    def a_pick_agrees_with_a_fresh_look(self) -> None:
        """Whether the book picks an account agrees with a fresh look, after every step."""
        for provider in PROVIDERS:
            picked = self.book.pick(provider, None, self.now)
            assert (picked is not None) == open_afresh(self.book, provider, self.now), (
                f"{provider} at {self.now}: picked {picked}"
            )

    @invariant()
    def closed_means_no_account_can_take_a_run(self) -> None:
        for provider, (since, until) in sorted(self.book.closed.items()):
            assert since <= until
            if since <= self.now < until:
                assert not open_afresh(self.book, provider, self.now), (
                    f"{provider} is marked closed ({since}, {until}) at {self.now},"
                    " but an account can take a run"
                )


ClosedSignalMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None, report_multiple_bugs=False
)
TestClosedSignal = ClosedSignalMachine.TestCase
