"""What a fleet member needs of its ledger and of its fence, as types.

:class:`~herdsman.runtime.fleet_member.FleetMember` and the supervisor call
these on the PostgreSQL :class:`~herdsman.runtime.store.fleet.FleetStore` and
the fence keeper's :class:`~herdsman.runtime.fence.Fence` in production, and
on the simulator's in-memory fleet (``herdsman.sim.fleet_store``) when the
fuzzer runs several members in one process. Both sides keep one contract,
which shared tests check against both (docs/simulator.md, "The simulated
fleet ledger").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from herdsman.runtime.store.base import Store
from herdsman.runtime.store.records import NewRun, RunRecord

if TYPE_CHECKING:
    from collections.abc import Callable

    from herdsman.runtime.store.fleet import (
        ClaimResult,
        ClaimRules,
        FleetView,
        Member,
        Poll,
        UsageByMember,
    )

__all__ = ["FenceLine", "FleetLedger"]


class FleetLedger(Store, Protocol):
    """A run ledger opened as one member of a fleet (docs/fleet.md says what each call does)."""

    #: This member's id in the ledger.
    member_id: str
    #: The lease, in seconds, each renewal gives.
    lease: float
    #: Until when, on the fence's clock, the lease certainly holds by the ledger's clock too.
    lease_end_local: float

    def renew(self) -> float:
        """Extend the lease by ``lease`` seconds; raise ``LeaseExpired`` if it had lapsed."""
        ...

    def leave(self) -> None:
        """End the lease now (a clean stop), waiving the margin."""
        ...

    def expire_lapsed(self, now: float) -> list[RunRecord]:
        """Remove members whose lease ended over the margin ago; their running runs are lost."""
        ...

    def members(self) -> list[Member]:
        """Every member still in the ledger, by id."""
        ...

    def view(self) -> FleetView:
        """Members, the ledger's clock and running runs per holder and provider."""
        ...

    def held_by(self, run_id: str) -> str | None:
        """The member holding ``run_id`` while it runs, else ``None``."""
        ...

    def running_elsewhere(self) -> list[RunRecord]:
        """Running runs held by other members, by ``seq``."""
        ...

    def account_usage_by_member(self, since: float) -> UsageByMember:
        """``account_usage`` since ``since``: this member's runs and attempts, others' apart."""
        ...

    def live_conversations(self, candidates: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which ``(workspace, conversation)`` of ``candidates`` have a queued or running run."""
        ...

    def submit_unless_busy(
        self, new: NewRun, now: float, reason: str, *, agent_exclusive: bool
    ) -> tuple[RunRecord, bool]:
        """Queue ``new``, or record it skipped if its lanes are busy fleet-wide."""
        ...

    def poll(self, cursor: int, queued: Sequence[str] = ()) -> Poll:
        """Queued runs past ``cursor``, cancels asked of this member, runs that left the queue."""
        ...

    def left_queue(self, run_ids: Sequence[str]) -> list[str]:
        """Which of ``run_ids`` are not queued (or unknown), in their order."""
        ...

    def request_cancel(self, run_id: str, now: float, reason: str) -> tuple[RunRecord, bool]:
        """Ask the holder of ``run_id`` to cancel it; the run as it stands, cancelled now?"""
        ...

    def claim_many(
        self,
        items: Sequence[tuple[str, str | None]],
        now: float,
        rules: ClaimRules | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> ClaimResult:
        """Claim ``(run_id, account)`` pairs in order, each started or refused."""
        ...


class FenceLine(Protocol):
    """A member's side of its fence: the deadlines it sends, and the news that it fell."""

    #: The deadline the keeper holds, on the fence's clock.
    deadline: float

    @property
    def pid(self) -> int:
        """The keeper's process id."""
        ...

    def extend(self, deadline: float) -> bool:
        """Tell the keeper the lease now holds until ``deadline``; whether it was in time."""
        ...

    async def wait_fallen(self) -> str:
        """Return why, once the deadline passes without an extension or the keeper dies."""
        ...

    async def close(self) -> None:
        """The member is done with its agents: the keeper kills any left, and goes."""
        ...
