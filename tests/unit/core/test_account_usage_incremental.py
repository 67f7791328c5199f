"""One account's usage, kept as runs start and end, against a recount from every run.

``AccountState`` keeps its window's usage between asks (``used``): it counts a
start into a ``runs`` budget's usage as it happens, and works the usage out
again only when something else changes or something leaves the window. The
reference here keeps nothing but a plain list of every run, here and
elsewhere in the fleet, and counts what is in the window from scratch at
every step, as docs/accounts.md defines each unit. Times are whole seconds
and figures halves, so every sum is exact and the two must agree exactly.
"""

from __future__ import annotations

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from herdsman.core.account_usage import (
    AccountSpec,
    AccountState,
    AccountUse,
    BudgetUnit,
    Charge,
    FleetUsage,
    spent_with_estimate,
)

T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock
UNITS: tuple[BudgetUnit, ...] = ("runs", "run_minutes", "tokens", "usd")

charge_st = st.builds(
    Charge, tokens=st.sampled_from((None, 0, 1, 7)), usd=st.sampled_from((None, 0.5, 2.0))
)


@attrs.define(eq=False)  # each use is one run: removed by identity
class Use:
    """One use counted toward the account: a run's start, its end once ended, what it spent.

    A charge known only after its run's end counts as an ended use of no
    minutes, and no start (``a_start`` false): it is no run of its own.
    """

    start: float
    end: float | None = None
    seconds: float = 0.0
    charge: Charge = attrs.field(factory=Charge)
    a_start: bool = True


def recount(
    unit: BudgetUnit,
    window: float | None,
    now: float,
    *,
    uses: list[Use],
    running: list[float],
    elsewhere: list[AccountUse] | None,
) -> float:
    """The usage at ``now``, from every use counted and the starts of the runs ``running``."""
    if window is None:
        if unit == "runs":
            return 0.0
        if unit == "run_minutes":
            return sum(now - start for start in running) / 60.0
        # Ended runs are kept only with a window: without one, nothing has a mean.
        return 0.0
    horizon = now - window
    others = elsewhere or []
    if unit == "runs":
        starts = [use.start for use in uses if use.a_start] + [use.started_at for use in others]
        return float(sum(1 for start in starts if start > horizon))
    ended = [use for use in uses if use.end is not None and use.end > horizon]
    ended_elsewhere = [
        (u, u.finished_at) for u in others if u.finished_at is not None and u.finished_at > horizon
    ]
    running_elsewhere = [u.started_at for u in others if u.finished_at is None]
    if unit == "run_minutes":
        seconds = sum(use.seconds for use in ended)
        seconds += sum(max(0.0, end - u.started_at) for u, end in ended_elsewhere)
        seconds += sum(now - max(start, horizon) for start in running + running_elsewhere)
        return seconds / 60.0
    figures = [getattr(use.charge, unit) for use in ended]
    figures += [getattr(u, unit) for u, _ in ended_elsewhere]
    stated = [figure for figure in figures if figure is not None]
    total = float(sum(stated))
    return spent_with_estimate(total, len(stated), len(running) + len(running_elsewhere))


class KeptUsage(RuleBasedStateMachine):
    """Random starts, ends, charges, restores, fleet polls and reloads; usage asked after each."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.window: float | None = None
        self.account = AccountState(AccountSpec("a"))
        # Runs counted in the window: started (still running) and ended ones.
        self.counted: list[Use] = []
        self.running: dict[str, Use] = {}
        self.elsewhere: list[AccountUse] | None = None
        self.next_id = 0

    @initialize(window=st.sampled_from((None, 600.0, 3600.0)), unit=st.sampled_from(UNITS))
    def setup(self, window: float | None, unit: BudgetUnit) -> None:
        self.window = window
        self.account.configure(AccountSpec("a", window, 3, unit))

    @rule(unit=st.sampled_from(UNITS), budget=st.sampled_from((None, 1, 3)))
    def reload(self, unit: BudgetUnit, budget: int | None) -> None:
        self.account.configure(AccountSpec("a", self.window, budget, unit))

    @rule()
    def begin(self) -> None:
        run_id = f"r{self.next_id}"
        self.next_id += 1
        self.account.begin(run_id, self.now)
        use = self.running[run_id] = Use(self.now)
        if self.window is not None:
            self.counted.append(use)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), spawned=st.booleans(), charge=charge_st)
    def end(self, data: st.DataObject, spawned: bool, charge: Charge) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.running)))
        self.account.end(run_id, self.now, spawned, charge)
        use = self.running.pop(run_id)
        if not spawned:
            if use in self.counted:
                self.counted.remove(use)
        else:
            use.end, use.seconds, use.charge = self.now, self.now - use.start, charge

    @precondition(lambda self: any(use.end is not None for use in self.counted))
    @rule(data=st.data(), charge=charge_st)
    def charge_later(self, data: st.DataObject, charge: Charge) -> None:
        ended = [use.end for use in self.counted if use.end is not None]
        end = data.draw(st.sampled_from(ended))
        self.account.charge(end, charge)
        if self.window is not None:
            # Counted as an ended run of no minutes, no start of its own.
            self.counted.append(Use(end, end, 0.0, charge, a_start=False))

    @rule(
        started=st.sampled_from((-4000.0, -900.0, -30.0)),
        ended=st.sampled_from((None, -20.0, -10.0)),
        charge=charge_st,
    )
    def restore(self, started: float, ended: float | None, charge: Charge) -> None:
        start, end = self.now + started, None if ended is None else self.now + ended
        self.account.record(start, end, charge)
        if self.window is not None:
            seconds = 0.0 if end is None else max(0.0, end - start)
            # A restored run that still runs counts its start only: it runs in
            # no process here, so it is not one of the running runs.
            self.counted.append(Use(start, end, seconds, charge))

    @rule(
        uses=st.lists(
            st.tuples(
                st.sampled_from((-4000.0, -700.0, -60.0, -1.0)),
                st.sampled_from((None, -30.0, 0.0)),
                st.sampled_from((None, 3)),
                st.sampled_from((None, 1.5)),
            ),
            max_size=3,
        ),
        gone=st.booleans(),
    )
    def poll_the_fleet(
        self, uses: list[tuple[float, float | None, int | None, float | None]], gone: bool
    ) -> None:
        now = self.now
        snapshot = [
            AccountUse("p", "a", now + s, None if e is None else now + max(s, e), t, u)
            for s, e, t, u in uses
        ]
        self.elsewhere = None if gone else snapshot
        self.account.set_elsewhere(None if gone else FleetUsage(snapshot))

    @rule(seconds=st.sampled_from((1.0, 30.0, 300.0, 600.0, 3600.0)))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def usage_is_the_recount(self) -> None:
        spec, now = self.account.spec, self.now
        running = [use.start for use in self.running.values()]
        expected = recount(
            spec.unit,
            spec.window,
            now,
            uses=self.counted,
            running=running,
            elsewhere=self.elsewhere,
        )
        assert self.account.used(now) == expected
        assert self.account.used(now) == expected  # asked again: the kept answer
        assert self.account.usage(now) == expected


KeptUsage.TestCase.settings = settings(
    max_examples=300, stateful_step_count=40, deadline=None, report_multiple_bugs=False
)
TestKeptUsage = KeptUsage.TestCase
