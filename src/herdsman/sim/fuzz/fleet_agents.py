"""The fleet's agents as processes: when each really lived, what the fence did, what must hold.

The fake runner tells :class:`Agents` of every spawn; the agent then lives
until its work is done, its member stops it, or its member's fence keeper
kills it — not until its member's task says so: a member killed with
SIGKILL records nothing, and its agents, in process groups of their own,
run on. So an agent's *real* lifetime is kept here, and the invariants are
checked on those lifetimes, fleet-wide, as the multi-process test of
issue 24 checks them on the agents' own timestamps:

* the runs of a conversation never overlap;
* never more agents alive at once than the fleet-wide cap;
* at most once: no run's agent is spawned twice;
* no agent lives on once the ledger has recorded its run ended (by its
  holder, or ``lost`` by another member's expiry of its lease).

:class:`SimFence` models the fence keeper (``herdsman.runtime.fence_keeper``)
for one member, as production guarantees it and no more: the keeper holds
the deadline of the last renewal extended in time (the member's local end
of its lease); once that passes without a newer one it fires, kills the
member's agents within one :data:`~herdsman.runtime.fence_keeper.SLICE`,
and stays fired. A killed member's agents are killed at the latest moment
the keeper allows, its deadline plus one slice — the pipe closing kills
them sooner in production, but the deadline is the promise the fleet's
margin rests on, and the latest kill is the one that tests it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs
import trio

from herdsman.runtime.fence_keeper import SLICE, in_time
from herdsman.sim.fuzz.invariants import Violation

__all__ = ["Agents", "Life", "SimFence"]


@attrs.define
class Life:
    """One agent: its run, its member, and when it lived (``end`` None: still alive)."""

    run_id: str
    member: int
    conversation: str | None
    start: float
    #: When its work would be done, had nobody stopped it.
    natural_end: float
    end: float | None = None
    #: Why it ended, when it was not its member that saw it end.
    how: str = ""


class Agents:
    """Every agent of the fleet, and the checks on their lifetimes."""

    def __init__(self, *, fence: bool) -> None:
        """``fence``: whether members' fence keepers are modelled (tests only turn them off)."""
        self.fence = fence
        self.lives: list[Life] = []
        #: Members whose fence has fired: the moment from which none of their agents lives.
        self._fired: dict[int, float] = {}

    def spawned(self, run_id: str, member: int, conversation: str | None, duration: float) -> Life:
        """An agent starts now for ``run_id`` on ``member``; it would work ``duration`` seconds."""
        now = trio.current_time()
        life = Life(run_id, member, conversation, now, now + duration)
        self.lives.append(life)
        fired = self._fired.get(member)
        if fired is not None:  # a fired keeper kills any agent it finds, within a slice
            self._cut(life, max(fired, now + SLICE), "killed by the fired fence keeper")
        return life

    def in_order(self) -> list[Life]:
        """Every agent by start, then run: agents spawned at one instant come in trio's
        wake-up order, which must decide nothing."""
        return sorted(self.lives, key=lambda life: (life.start, life.run_id))

    def ended(self, life: Life) -> None:
        """The member saw its agent end now (its work done, or stopped by the member)."""
        now = trio.current_time()
        life.end = now if life.end is None else min(life.end, now)

    def member_died(self, member: int, fence: SimFence) -> None:
        """``member`` was killed now: its agents live on until the fence kills them, or for ever."""
        if not self.fence:
            for life in self._alive(member):
                life.end, life.how = life.natural_end, "outlived its killed member, unfenced"
            return
        self.fence_fired(member, fence.deadline + SLICE)

    def fence_fired(self, member: int, at: float) -> None:
        """``member``'s keeper kills its agents at ``at``, and any it finds later."""
        if not self.fence:
            return
        self._fired[member] = min(self._fired.get(member, math.inf), at)
        for life in self._alive(member):
            self._cut(life, max(at, life.start), "killed by its member's fence keeper")

    def _alive(self, member: int) -> list[Life]:
        return [life for life in self.lives if life.member == member and life.end is None]

    @staticmethod
    def _cut(life: Life, at: float, how: str) -> None:
        life.end = min(at, life.natural_end)
        life.how = how if at < life.natural_end else "its work done, its member dead"

    # -- the invariants --------------------------------------------------------

    def violations(self, cap: int, until: float) -> list[Violation]:
        """What the lifetimes break, in a fixed order; ``until``: the end of the run."""
        found: list[Violation] = []
        spawned: dict[str, int] = {}
        for life in self.in_order():
            spawned[life.run_id] = spawned.get(life.run_id, 0) + 1
            if spawned[life.run_id] == 2:
                found.append(
                    Violation(
                        "at most once",
                        life.start,
                        f"run {life.run_id}'s agent was spawned again (member {life.member})",
                    )
                )
        found += self._overlaps(until)
        found += self._over_cap(cap, until)
        return found

    def outlived(self, ended: dict[str, float]) -> list[Violation]:
        """Agents alive after the ledger recorded their run ended (``ended``: run -> when).

        Once a run is recorded ended — by its holder, or ``lost`` by another
        member's expiry — nothing of it may run: its lanes are free for the
        next run.
        """
        found = []
        for life in self.in_order():
            at = ended.get(life.run_id)
            # Within a microsecond: the ledger's times are unix seconds, where
            # a float keeps about a quarter of one.
            if at is not None and (life.end is None or life.end > at + 1e-6):
                lived = "still alive" if life.end is None else f"alive until t={life.end:.3f}"
                found.append(
                    Violation(
                        "outlived its run",
                        at,
                        f"run {life.run_id} was recorded ended at t={at:.3f}, its agent"
                        f" (member {life.member}) {lived}" + (f" ({life.how})" if life.how else ""),
                    )
                )
        return found

    def _overlaps(self, until: float) -> list[Violation]:
        found = []
        by_conversation: dict[str, list[Life]] = {}
        for life in self.lives:
            if life.conversation is not None:
                by_conversation.setdefault(life.conversation, []).append(life)
        for conversation in sorted(by_conversation):
            lives = sorted(
                by_conversation[conversation], key=lambda life: (life.start, life.run_id)
            )
            for earlier, later in _pairs(lives):
                earlier_end = until if earlier.end is None else earlier.end
                later_end = until if later.end is None else later.end
                if later.start < earlier_end and earlier.start < later_end:
                    found.append(
                        Violation(
                            "overlap",
                            later.start,
                            f"runs {earlier.run_id} (member {earlier.member}) and"
                            f" {later.run_id} (member {later.member}) of conversation"
                            f" {conversation} were alive together for"
                            f" {min(earlier_end, later_end) - later.start:.3f}s"
                            + (f" ({earlier.run_id}: {earlier.how})" if earlier.how else ""),
                        )
                    )
        return found

    def _over_cap(self, cap: int, until: float) -> list[Violation]:
        # Ends before starts at one instant: an agent that ends as another
        # starts does not overlap it.
        moments = sorted(
            [(life.start, 1, life.run_id) for life in self.lives]
            + [(until if life.end is None else life.end, -1, life.run_id) for life in self.lives],
            key=lambda moment: (moment[0], moment[1], moment[2]),
        )
        alive = 0
        for at, step, run_id in moments:
            alive += step
            if alive > cap:
                return [
                    Violation(
                        "fleet cap",
                        at,
                        f"{alive} agents alive at once (the fleet-wide cap is {cap}),"
                        f" when {run_id}'s started",
                    )
                ]
        return []


def _pairs(lives: list[Life]) -> Iterable[tuple[Life, Life]]:
    for index, earlier in enumerate(lives):
        for later in lives[index + 1 :]:
            yield earlier, later


class SimFence:
    """One member's fence keeper, modelled: a deadline, extended in time or fallen for good.

    What ``FleetMember`` calls of production's ``Fence`` (``extend``,
    ``wait_fallen``, ``close``), on trio's clock — the simulator's
    ``fence_clock``. When the deadline passes without an extension, the
    keeper fires: :class:`Agents` learns that the member's agents die one
    slice later, and the member learns its fence fell.
    """

    def __init__(self, member: int, deadline: float, agents: Agents) -> None:
        """The keeper of ``member``, holding ``deadline`` (trio's clock)."""
        self.member = member
        #: No process keeps a simulated fence.
        self.pid = 0
        self.deadline = deadline
        self.fallen: str | None = None
        self._agents = agents
        self._changed = trio.Event()

    def extend(self, deadline: float) -> bool:
        """As ``Fence.extend``: taken if written before the deadline in force passed."""
        if self.fallen is not None:
            return False
        if not in_time(trio.current_time(), self.deadline):
            self._fall("the fleet lease was not renewed before its deadline")
            return False
        self.deadline = deadline
        self._wake()
        return True

    async def wait_fallen(self) -> str:
        """Return why, once the deadline passes without an extension."""
        while self.fallen is None:
            changed = self._changed
            left = self.deadline - trio.current_time()
            if left <= 0:
                self._fall("the fleet lease was not renewed before its deadline")
                break
            with trio.move_on_after(left):
                await changed.wait()
        assert self.fallen is not None
        return self.fallen

    async def close(self) -> None:
        """Nothing to close: the simulated keeper has no process."""

    def _fall(self, why: str) -> None:
        if self.fallen is None:
            self.fallen = why
            self._agents.fence_fired(self.member, self.deadline + SLICE)
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
