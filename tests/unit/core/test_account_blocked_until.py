"""One account's ``blocked_until`` against the two questions it answers in one pass.

``AccountState.blocked_until`` is what the book's gate asks of every account
of a provider: None when the account can take a run, else until when it
cannot. It must be exactly :meth:`~AccountState.why_not` (worked out from
the usage afresh, never from what :meth:`~AccountState.used` keeps) and
:meth:`~AccountState.free_at` (``math.inf`` for its None), after every step of
random starts, ends, rests, logins, restored usage, fleet polls, reloads and
time, including time set just before and at the moments the answer names.
What the account keeps between asks holds until the moment its oldest use
leaves the window (:func:`leaves_window`), which must be exact for the
comparison the window's expiry makes, whatever the floats.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from herdsman.core.account_usage import (
    AccountSpec,
    AccountState,
    AccountUse,
    BudgetUnit,
    Charge,
    FleetUsage,
    leaves_window,
)

T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock
UNITS: tuple[BudgetUnit, ...] = ("runs", "run_minutes", "tokens", "usd")

spec_st = st.builds(
    AccountSpec,
    name=st.just("a"),
    window=st.sampled_from((None, 600.0, 3600.0)),
    budget=st.sampled_from((None, 1, 2, 4)),
    unit=st.sampled_from(UNITS),
    concurrency=st.sampled_from((None, 1, 3)),
)


def expected_blocked_until(account: AccountState, now: float) -> float | None:
    """The answer from the two questions asked apart: can it take one, and if not, until when."""
    if account.why_not(now) is None:
        return None
    free_at = account.free_at(now)
    return math.inf if free_at is None else free_at


class BlockedUntil(RuleBasedStateMachine):
    """Random events on one account; its one-pass answer must be the two questions' answer."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.account = AccountState(AccountSpec("a"))
        self.running: list[str] = []
        self.next_id = 0

    @initialize(spec=spec_st)
    def setup(self, spec: AccountSpec) -> None:
        self.account.configure(spec)

    @rule(spec=spec_st)
    def reload(self, spec: AccountSpec) -> None:
        self.account.configure(spec)

    @rule()
    def begin(self) -> None:
        run_id = f"r{self.next_id}"
        self.next_id += 1
        self.account.begin(run_id, self.now)
        self.running.append(run_id)

    @precondition(lambda self: self.running)
    @rule(
        data=st.data(),
        spawned=st.booleans(),
        charge=st.builds(Charge, st.sampled_from((None, 1, 5)), st.sampled_from((None, 0.5))),
    )
    def end(self, data: st.DataObject, spawned: bool, charge: Charge) -> None:
        run_id = data.draw(st.sampled_from(self.running))
        self.running.remove(run_id)
        self.account.end(run_id, self.now, spawned, charge)

    @rule(seconds=st.sampled_from((30.0, 900.0, 7200.0)))
    def rest(self, seconds: float) -> None:
        """A usage limit: the account rests (as the book's ``rest`` sets it)."""
        self.account.exhausted_until = self.now + seconds
        self.account.message = "limit"

    @rule()
    def wake(self) -> None:
        self.account.exhausted_until = self.account.message = None
        self.account.needs_login = None

    @rule()
    def need_login(self) -> None:
        self.account.needs_login = "401"

    @rule(
        started=st.sampled_from((-4000.0, -500.0, -30.0)),
        ended=st.sampled_from((None, -20.0)),
    )
    def restore(self, started: float, ended: float | None) -> None:
        end = None if ended is None else self.now + ended
        self.account.record(self.now + started, end, Charge(2, 1.0))

    @rule(
        uses=st.lists(
            st.tuples(st.sampled_from((-700.0, -60.0)), st.sampled_from((None, -30.0))),
            max_size=3,
        ),
        gone=st.booleans(),
    )
    def poll_the_fleet(self, uses: list[tuple[float, float | None]], gone: bool) -> None:
        now = self.now
        snapshot = [
            AccountUse("p", "a", now + s, None if e is None else now + max(s, e), 1, 0.5)
            for s, e in uses
        ]
        self.account.set_elsewhere(None if gone else FleetUsage(snapshot))

    @rule(seconds=st.sampled_from((0.1, 1.0, 60.0, 600.0, 3600.0, 1e-6)))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @rule(at_it=st.booleans())
    def to_the_edge(self, at_it: bool) -> None:
        """Just before the moment the account names (blocked still), or at it."""
        until = self.account.blocked_until(self.now)
        if until is None or until == math.inf:
            return
        self.now = until if at_it else max(self.now, math.nextafter(until, -math.inf))

    @invariant()
    def one_pass_is_the_two_questions(self) -> None:
        now = self.now
        expected = expected_blocked_until(self.account, now)
        got = self.account.blocked_until(now)
        assert got == expected, f"at {now}: blocked until {got}, not {expected}"
        # Asked again, and in the other order: what either remembers changes nothing.
        assert self.account.blocked_until(now) == expected
        assert expected_blocked_until(self.account, now) == expected


BlockedUntil.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, report_multiple_bugs=False
)
TestBlockedUntil = BlockedUntil.TestCase


@given(
    at=st.floats(min_value=0.0, max_value=4e9, allow_nan=False),
    window=st.one_of(
        st.sampled_from((600.0, 3600.0, 18000.0, 0.1)),
        st.floats(min_value=1e-3, max_value=1e7, allow_nan=False),
    ),
)
def test_a_use_leaves_the_window_at_the_first_moment_expiry_drops_it(
    at: float, window: float
) -> None:
    """``leaves_window`` is the first float ``now`` at which ``now - window >= at``."""
    moment = leaves_window(at, window)
    assert moment - window >= at
    assert math.nextafter(moment, -math.inf) - window < at
