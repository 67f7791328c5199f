"""An account's remembered "can it take a run" answer against one worked out from scratch.

``AccountState.can_take`` is asked for every account before every start and
whenever runs wait, so it remembers its answer over the span of time the
answer holds, and every event that may change it forgets it. After every
step of random starts, ends (spawned or not), charges, restored usage, rests
and their ends, logins, warnings, fleet snapshots, reloads and time, the
remembered answer must be :meth:`AccountState.why_not`'s, which works the
usage out afresh (``usage``, never the remembered ``used``). Time also jumps
to just before, and to the very moment, a use leaves a window or a rest
ends: where a remembered answer would go stale if it were kept a moment too
long.
"""

from __future__ import annotations

import math

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from herdsman.core.account_usage import (
    AccountSpec,
    AccountState,
    AccountUse,
    Charge,
    FleetUsage,
    leaves_window,
)

T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock

spec_st = st.builds(
    AccountSpec,
    name=st.just("a"),
    window=st.sampled_from((None, 600.0, 3600.0)),
    budget=st.sampled_from((None, 1, 2, 5)),
    unit=st.sampled_from(("runs", "run_minutes", "tokens", "usd")),
    concurrency=st.sampled_from((None, 1, 2)),
)
charge_st = st.builds(
    Charge, tokens=st.sampled_from((None, 1, 3)), usd=st.sampled_from((None, 0.5, 2.0))
)


class CanTakeMemoMachine(RuleBasedStateMachine):
    """Random events on one account and time; its remembered answer must be the fresh one."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.account = AccountState(AccountSpec("a"))
        self.running: list[str] = []
        self.next_id = 0
        # Moments a use was counted, and when rests end: where an answer may change.
        self.uses: set[float] = set()
        self.rests: set[float] = set()

    @initialize(spec=spec_st)
    def setup(self, spec: AccountSpec) -> None:
        self.account.configure(spec)

    def counted(self, at: float) -> None:
        self.uses.add(at)

    def edges(self) -> list[float]:
        """The next few moments a use leaves the account's window or a rest ends."""
        window = self.account.spec.window
        moments = set(self.rests)
        if window is not None:
            moments.update(leaves_window(at, window) for at in self.uses)
        return sorted(moment for moment in moments if moment > self.now)[:3]

    @rule()
    def begin(self) -> None:
        """A start, as the book makes one: only when the account can take it."""
        if self.account.can_take(self.now):
            run_id = f"r{self.next_id}"
            self.next_id += 1
            self.account.begin(run_id, self.now)
            self.running.append(run_id)
            self.counted(self.now)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), spawned=st.booleans(), charge=charge_st)
    def end(self, data: st.DataObject, spawned: bool, charge: Charge) -> None:
        run_id = data.draw(st.sampled_from(self.running))
        self.running.remove(run_id)
        self.account.end(run_id, self.now, spawned, charge)
        self.counted(self.now)

    @rule(charge=charge_st, ago=st.sampled_from((0.0, 120.0)))
    def charge(self, charge: Charge, ago: float) -> None:
        self.account.charge(self.now - ago, charge)
        self.counted(self.now - ago)

    @rule(
        ago=st.sampled_from((30.0, 500.0, 3000.0)),
        lasted=st.sampled_from((None, 0.0, 20.0)),
        charge=charge_st,
    )
    def record(self, ago: float, lasted: float | None, charge: Charge) -> None:
        """Usage restored after a restart (``lasted`` None: still running then)."""
        start = self.now - ago
        self.account.record(start, None if lasted is None else start + lasted, charge)
        self.counted(start)
        if lasted is not None:
            self.counted(start + lasted)

    @rule(seconds=st.sampled_from((None, 30.0, 900.0)))
    def rest(self, seconds: float | None) -> None:
        """A usage limit (or, None, the end of a rest before its time)."""
        if seconds is None:
            self.account.rest(None, None)
        else:
            self.account.rest(self.now + seconds, "limit")
            self.rests.add(self.now + seconds)

    @rule(message=st.sampled_from((None, "401")))
    def need_login(self, message: str | None) -> None:
        self.account.need_login(message)

    @rule(seconds=st.sampled_from((60.0, 900.0)))
    def warn(self, seconds: float) -> None:
        """A warning that it is near its limit: it changes the ranking, never the answer."""
        self.account.near_until = self.now + seconds

    @rule(
        uses=st.lists(
            st.tuples(st.sampled_from((-3000.0, -300.0, -30.0)), st.booleans(), charge_st),
            max_size=3,
        ),
        poll=st.booleans(),
    )
    def elsewhere(self, uses: list[tuple[float, bool, Charge]], poll: bool) -> None:
        """A fleet poll's snapshot of other members' runs (or none, outside a fleet)."""
        snapshot = [
            AccountUse(
                "p", "a", self.now + ago, None if running else self.now, charge.tokens, charge.usd
            )
            for ago, running, charge in uses
        ]
        self.account.set_elsewhere(FleetUsage(snapshot) if poll else None)
        for use in snapshot:
            self.counted(use.started_at)

    @rule(spec=spec_st)
    def reload(self, spec: AccountSpec) -> None:
        self.account.configure(spec)

    @rule(seconds=st.sampled_from((0.5, 59.0, 90.0, 600.0, 3600.0)))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.edges())
    @rule(data=st.data(), at_it=st.booleans())
    def to_the_edge(self, data: st.DataObject, at_it: bool) -> None:
        """Just before one of the next moments a use leaves the window or a rest ends, or at it."""
        moment = data.draw(st.sampled_from(self.edges()))
        self.now = moment if at_it else max(self.now, math.nextafter(moment, -math.inf))

    @invariant()
    def remembered_answer_is_the_fresh_one(self) -> None:
        fresh = self.account.why_not(self.now)
        remembered = self.account.can_take(self.now)
        assert remembered == (fresh is None), (
            f"at {self.now}: remembered can_take={remembered}, but afresh: {fresh or 'it can'}"
        )


CanTakeMemoMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None, report_multiple_bugs=False
)
TestCanTakeMemo = CanTakeMemoMachine.TestCase
