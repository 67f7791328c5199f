"""The fence's rule between a member and its keeper, over every interleaving (hypothesis).

A member renews its lease on the server and then writes the lease's local
end to its keeper; the keeper wakes now and then, reads its clock, then
the pipe, and judges (fence_keeper.py's ``Watch`` and ``in_time``, which
the real keeper and ``Fence.extend`` use). Times are one clock: a member's
clock and the server's run at the same rate (docs/fleet.md). Drawn: the
lease, how long each renewal takes and where in it the server reads its
clock, the pauses between renewals, when the keeper wakes and how long it
takes between reading its clock and reading the pipe.

* Safety: whenever the keeper lets the agents live, the server's lease is
  still running — so no agent is alive once the member's runs may be lost.
* Agreement: while the member's extensions are in time and its deadlines
  move on, the keeper does not fire: a member that believes its fence holds
  is right.
* Once fired, the keeper stays fired.
"""

from __future__ import annotations

import math

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from herdsman.runtime.fence_keeper import Watch, in_time


@attrs.frozen
class Renewal:
    """One renewal: when the member read its clock, the server its own, the write ended."""

    sent: float
    statement: float
    written: float
    deadline: float


@attrs.frozen
class Timeline:
    """A member's renewals (the join first) and the server's lease end after each."""

    lease: float
    renewals: list[Renewal]
    lease_until: list[float]
    #: The member's verdict on each write after the join: in time or not.
    in_time: list[bool]

    def server_lease_at(self, t: float) -> float:
        """When the server's lease ends, as of ``t`` (renewals whose statement ran by then)."""
        end = self.lease_until[0]
        for renewal, until in zip(self.renewals, self.lease_until, strict=True):
            if renewal.statement <= t:
                end = until
        return end


@st.composite
def timelines(draw: st.DrawFn) -> Timeline:
    lease = draw(st.floats(1.0, 10.0))
    renewals: list[Renewal] = []
    lease_until: list[float] = []
    verdicts: list[bool] = []
    t = 0.0
    for n in range(draw(st.integers(1, 8))):
        if n:
            t += draw(st.floats(0.0, lease))  # the pause before a renewal
        duration = draw(st.floats(0.0, lease * 1.5))
        statement = t + duration * draw(st.floats(0.0, 1.0))
        if lease_until and statement > lease_until[-1]:
            break  # lapsed: renew() raises LeaseExpired, and nothing is written
        renewal = Renewal(t, statement, t + duration, t + lease)
        if renewals:
            # The member reads its clock right after the write ended.
            verdicts.append(in_time(renewal.written, renewals[-1].deadline))
        renewals.append(renewal)
        lease_until.append(statement + lease)
        if verdicts and not verdicts[-1]:
            break  # fallen: the member writes nothing more
        t = renewal.written
    return Timeline(lease, renewals, lease_until, verdicts)


def judgments(
    timeline: Timeline, wakes: list[tuple[int, float, float]]
) -> list[tuple[float, bool, float]]:
    """Each wakeup: the time, whether it kills, the deadline held.

    A wakeup ``(anchor, offset, lag)`` reads the clock ``offset`` from a
    moment that matters (a write's end or a deadline, picked by ``anchor``)
    and the pipe ``lag`` later.
    """
    joined = timeline.renewals[0]
    moments = [t for r in timeline.renewals for t in (r.written, r.deadline)]
    watch = Watch(joined.deadline)
    seen = 1  # the join's deadline came on the command line
    out = []
    # The keeper is started once the member has joined.
    times = sorted(
        (max(joined.written, moments[anchor % len(moments)] + offset), lag)
        for anchor, offset, lag in wakes
    )
    for at, lag in times:
        written = []
        # The pipe is read ``lag`` after the clock: every write ended by then.
        while seen < len(timeline.renewals) and timeline.renewals[seen].written <= at + lag:
            written.append(timeline.renewals[seen].deadline)
            seen += 1
        kill, _ = watch.judge(written, at)
        out.append((at, kill, watch.deadline))
    return out


wakes = st.lists(
    st.tuples(st.integers(0, 20), st.floats(-2.0, 2.0), st.floats(0.0, 2.0)), max_size=30
)


@settings(max_examples=300, deadline=None)
@given(timelines(), wakes)
def test_the_keeper_never_lets_agents_live_past_the_server_s_lease(
    timeline: Timeline, wakes: list[tuple[int, float, float]]
) -> None:
    for at, kill, _ in judgments(timeline, wakes):
        if not kill:
            assert at < timeline.server_lease_at(at)


@settings(max_examples=300, deadline=None)
@given(timelines(), wakes)
def test_the_keeper_does_not_fire_while_the_member_extends_in_time(
    timeline: Timeline, wakes: list[tuple[int, float, float]]
) -> None:
    for at, kill, _ in judgments(timeline, wakes):
        # The member's deadline at ``at``: that of its last write checked by then.
        checked = [r for r in timeline.renewals if r.written <= at]
        verdicts = timeline.in_time[: len(checked) - 1]
        if all(verdicts) and at < checked[-1].deadline:
            assert not kill, "the member believes its fence holds; the keeper fired"


@settings(max_examples=300, deadline=None)
@given(timelines(), wakes)
def test_a_fired_keeper_stays_fired(
    timeline: Timeline, wakes: list[tuple[int, float, float]]
) -> None:
    kills = [kill for _, kill, _ in judgments(timeline, wakes)]
    if True in kills:
        assert all(kills[kills.index(True) :])


@given(st.lists(st.floats(0.0, 1e12), max_size=20).map(sorted))
def test_without_a_deadline_the_keeper_never_fires_and_waits_for_its_pipe_alone(
    moments: list[float],
) -> None:
    # A sole supervisor's keeper (docs/operations.md): no lease, so nothing to
    # wake for but the pipe's end, and no wakeups ten times a second.
    watch = Watch(math.inf)
    for now in moments:
        assert watch.judge([], now) == (False, math.inf)
    assert not watch.fired
