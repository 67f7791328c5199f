"""What one fleet fuzz seed tries: members on one ledger, runs submitted to them, one killed.

A fleet scenario is several supervisors, each a fleet member with its own
state directory and fake runner, sharing one simulated ledger
(``herdsman.sim.fleet_store``) under one ``MockClock``. Runs arrive at
drawn moments, each submitted to a drawn member, on a few hot
conversations, with agents that take longer than a lease. The fault is
issue 24's D5: at a drawn moment a member is killed (``kill``) — its tasks
cancelled with nothing more recorded, as SIGKILL leaves it — so its lease
lapses and the others take its conversations over. In a third of the
seeds a member is also cut off from the ledger for a while (``partition``):
cut off past its lease's end, its fence falls while it lives.

Every draw comes from ``random.Random(f"fleet:{seed}")`` in a fixed order:
a seed means the same scenario in any process. ``fence`` is for tests only:
off, the killed member's agents are modelled without the fence keeper that
production starts, which is how the fuzzer shows that the fault bites.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import attrs

from herdsman.runtime.store.fleet import FENCE_MARGIN

__all__ = ["FleetScenario", "draw_fleet_scenario"]

CONVERSATIONS = ("c1", "c2", "c3")
#: How far apart (simulated seconds) the members start: their timers never
#: fall at one instant, where trio's wake-up order would decide who goes first.
STAGGER = 0.0137


@attrs.frozen
class FleetScenario:
    """A seed's fleet: its settings, its runs in time order, and the member killed.

    ``runs``: each ``{"id", "t", "member", "conversation", "duration"}``
    (``conversation`` may be absent). ``kill``: ``{"member", "t"}`` and,
    in some, ``"join_after"``: seconds after the kill, a new member joins on
    a fresh state directory, as an operator replaces a dead machine (the
    dead one is never restarted); or ``None`` for no fault.
    """

    seed: int
    members: int
    lease: float
    poll: float
    #: The fleet-wide cap on the provider's simultaneous runs (``[fleet] provider_caps``).
    cap: int
    #: Each member's own ``concurrency``.
    slots: int
    runs: tuple[Mapping[str, Any], ...]
    kill: Mapping[str, Any] | None
    #: Cancels asked by a client through a member, each ``{"t", "run", "member"}``,
    #: in time order: the member may not hold the run, and asks its holder.
    cancels: tuple[Mapping[str, Any], ...] = ()
    #: ``{"member", "t", "seconds"}``: the member cannot reach the ledger for
    #: that long (a network cut); ``None`` for none. Longer than the time left
    #: on its lease, its fence falls: its agents die, it stops, its runs are lost.
    partition: Mapping[str, Any] | None = None
    #: Whether the killed member's fence keeper is modelled (tests turn it off).
    fence: bool = True
    #: How long after a lease ends the others expire it (tests shorten it).
    margin: float = FENCE_MARGIN

    def config(self, member: int) -> str:
        """The configuration file of member ``member`` (a state directory of its own)."""
        return (
            "[supervisor]\n"
            f'state_dir = "/herdsman-sim/member-{member}"\n'
            "[scheduling]\nagent_exclusive = false\n"
            '[store]\nurl = "postgresql://sim@ledger.invalid/herdsman"\n'
            f'[fleet]\nenabled = true\nlease = "{self.lease:g}s"\npoll = "{self.poll:g}s"\n'
            f"provider_caps = {{ demo = {self.cap} }}\n"
            f'[providers.demo]\nexec = ["demo"]\nconcurrency = {self.slots}\n'
        )

    def as_json(self) -> dict[str, Any]:
        """The scenario as plain data."""
        return {
            "seed": self.seed,
            "members": self.members,
            "lease": self.lease,
            "poll": self.poll,
            "cap": self.cap,
            "slots": self.slots,
            "runs": [dict(run) for run in self.runs],
            "kill": None if self.kill is None else dict(self.kill),
            "cancels": [dict(cancel) for cancel in self.cancels],
            "partition": None if self.partition is None else dict(self.partition),
            "fence": self.fence,
            "margin": self.margin,
        }


def draw_fleet_scenario(seed: int, *, members: int = 3) -> FleetScenario:
    """The fleet scenario of ``seed``: ``members`` members, runs, and one member killed."""
    if members < 2:
        raise ValueError(f"a fleet scenario needs at least 2 members, got {members}")
    rng = random.Random(f"fleet:{seed}")
    lease = rng.choice([3.0, 4.0, 6.0])
    cap = rng.randint(2, members + 1)
    slots = rng.randint(1, 3)
    runs: list[dict[str, Any]] = []
    t = 0.0
    for number in range(rng.randint(6, 14)):
        t += rng.choice([0.0, 0.3, 1.0, 2.5])
        run: dict[str, Any] = {
            "id": f"r{number:02d}",
            # Distinct instants: two submits never race for one moment.
            "t": round(t + rng.uniform(0.0, 0.5), 4),
            "member": rng.randrange(members),
            # Longer than a lease, often: the dead member's agents would
            # outlive its lease without the fence.
            "duration": round(rng.uniform(1.0, 4.0 * lease), 4),
        }
        conversation = rng.choice([None, *CONVERSATIONS, *CONVERSATIONS])
        if conversation is not None:
            run["conversation"] = conversation
        runs.append(run)
    runs.sort(key=lambda run: (run["t"], run["id"]))
    last = runs[-1]["t"]
    kill: dict[str, Any] = {
        "member": rng.randrange(members),
        "t": round(rng.uniform(0.5, last + lease), 4),
    }
    join_after = rng.choice([None, 1.0, 2 * lease])
    if join_after is not None:
        kill["join_after"] = join_after + STAGGER / 2  # off the others' instants
    cancels = []
    for run in rng.sample(runs, rng.choice([0, 0, 1, 2])):
        at = round(float(run["t"]) + rng.uniform(0.1, 2.0 * lease), 4) + STAGGER / 3
        cancels.append({"t": at, "run": run["id"], "member": rng.randrange(members)})
    cancels.sort(key=lambda cancel: (cancel["t"], cancel["run"]))
    partition = None
    if rng.random() < 1 / 3:
        partition = {
            "member": rng.randrange(members),
            "t": round(rng.uniform(0.5, last + lease), 4) + STAGGER / 5,
            "seconds": rng.choice([0.5, 2.0, 4.0]) * lease,
        }
    return FleetScenario(
        seed, members, lease, 1.0, cap, slots, tuple(runs), kill, tuple(cancels), partition
    )
