"""A supervisor as one member of a fleet: its lease, its claims and its view of the queue.

The supervisor keeps its own scheduler (docs/scheduling.md); in a fleet that
scheduler proposes and the ledger decides (docs/fleet.md):

* **The queue, in the fleet's order.** Every run, submitted here or to
  another member, enters the local scheduler from the ledger, polled in
  ``seq`` order (:meth:`FleetMember.read_new`), so the local order on every
  lane is the fleet's. Runs submitted here wake the poll at once.
* **Claims.** The runs the scheduler would start are claimed
  (:meth:`FleetStore.claim_many <herdsman.runtime.store.fleet.FleetStore.claim_many>`)
  instead of recorded as started. A run ``gone`` (claimed by another member,
  or cancelled) leaves the local scheduler. A run refused for a busy lane,
  an earlier queued run or a fleet-wide cap or account is *parked*: held in
  the local scheduler (the core's ``hold``), so its lanes stay held and it
  is not offered again, but its slot is free at once for a run on another
  lane; the next poll puts it back in its place (the core's ``requeue``).
  A refusal for a fleet-wide cap or account also closes its provider here
  until that poll (:meth:`FleetMember.gate`): every other run of it would
  be refused alike, one claim transaction after another.
* **Runs re-queued elsewhere** (a usage limit) come back through the poll,
  and enter the local scheduler in their place by ``seq``, the fleet's
  submission order, ahead of runs submitted after them.
* **Runs that left the queue elsewhere** (claimed by another member,
  cancelled, ended, pruned) while queued here: each poll passes the ids
  queued locally and learns which the ledger no longer has queued, and the
  supervisor withdraws them, as it does a run whose claim found it gone.
* **Cancels asked through another member** of a run held here arrive with
  the poll, and are carried out as a local cancel is.
* **The lease**, renewed about three times per lease, with the lapsed
  members of the fleet expired on the way. A lease found lapsed means this
  member may have been declared gone: it stops its runs and exits.
* **The fence** (fence.py): after each renewal the member's fence keeper
  learns until when the lease certainly holds, and kills the member's
  agents if that passes first, or the member dies. The member stops too
  when its fence falls.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio

from herdsman.config import Config
from herdsman.core import RunRequest, StartGate
from herdsman.runtime.fleet_accounts import claim_budgets
from herdsman.runtime.store import RunRecord, Store, StoreError
from herdsman.runtime.store.errors import LeaseExpired

if TYPE_CHECKING:
    from herdsman.runtime.fleet_ports import FenceLine, FleetLedger
    from herdsman.runtime.ledger import Ledger
    from herdsman.runtime.store.fleet import (
        ClaimResult,
        ClaimRules,
        FleetView,
        Poll,
    )

__all__ = ["RENEWALS_PER_LEASE", "FleetMember", "Refused"]

log = logging.getLogger("herdsman")

#: How many times a lease is renewed while it runs: two renewals may fail
#: (a slow server, a ledger batch ahead of them) before it lapses.
RENEWALS_PER_LEASE = 3


class Refused(enum.Enum):
    """What a member does with a run whose claim was refused."""

    #: Claimed by another member, or cancelled: it leaves the local scheduler.
    GONE = "gone"
    #: One of its lanes runs elsewhere, or an earlier run waits on it: held.
    LANE = "lane"
    #: A fleet-wide cap, or its account, said no: held, and its provider closed.
    CAP = "cap"


class _ClosedProviders:
    """A start gate that closes some providers and asks ``inner`` about the rest."""

    def __init__(self, inner: StartGate, closed: set[str]) -> None:
        self._inner = inner
        self._closed = closed

    def can_start(self, provider: str) -> bool:
        return provider not in self._closed and self._inner.can_start(provider)

    def started(self, run: RunRequest) -> None:
        self._inner.started(run)


class FleetMember:
    """This supervisor's part in a fleet: the poll cursor, the providers closed, the lease.

    ``store`` is the :class:`FleetStore` the supervisor's ledger writes to;
    ``fence``, the keeper that kills this member's agents when its lease
    runs out or the member dies (``herdsman run`` always has one; without
    one, nothing stops the agents of a member that dies or hangs).
    Everything here runs in the trio thread, except the operations handed
    to the ledger (``read_new``, the renewal), which only touch ``store``.
    """

    def __init__(self, store: FleetLedger, fence: FenceLine | None = None) -> None:
        """Start with nothing seen: the first poll reads the whole queue, in ``seq`` order."""
        self.store = store
        self.fence = fence
        #: The highest ``seq`` or ``requeue_mark`` taken into the local scheduler.
        self.cursor = 0
        # Providers a claim was refused for a fleet-wide cap or an account,
        # closed until the next poll. Only asked about, never iterated.
        self._closed: set[str] = set()
        self._poke = trio.Event()

    # -- the queue -----------------------------------------------------------

    def read_new(self, queued: Sequence[str], store: Store) -> Poll:
        """Ledger operation: queued runs after the cursor (new or re-queued), cancels asked.

        ``queued``: the runs the local scheduler holds queued, read in the
        trio thread before the call; the poll says which of them have left
        the ledger's queue (:attr:`Poll.left`). The cursor moves in
        :meth:`take_new`, once the read has committed.
        """
        del store  # the ledger hands over the store it was given: self.store
        return self.store.poll(self.cursor, queued)

    def take_new(self, poll: Poll) -> list[RunRecord]:
        """Move the cursor past what ``poll`` read; return its runs (in ``seq`` order)."""
        self.cursor = max(self.cursor, poll.cursor)
        return poll.runs

    def poke(self) -> None:
        """Poll now (a run was submitted here), rather than at the next interval."""
        self._poke.set()

    async def poll_loop(
        self, interval: Callable[[], float], poll: Callable[[], Awaitable[None]]
    ) -> None:
        """Call ``poll`` every ``interval()`` seconds, or sooner when poked; forever."""
        while True:
            with trio.move_on_after(interval()):
                await self._poke.wait()
            self._poke = trio.Event()
            try:
                await poll()
            except StoreError as exc:
                # The lease task decides when the ledger is gone for good;
                # a failed read is tried again at the next poll.
                log.error("could not read the fleet's queue from the ledger: %s", exc)

    # -- refused claims -------------------------------------------------------

    def close(self, provider: str) -> None:
        """A fleet-wide cap or an account refused a run of ``provider``: start none until the poll.

        The refused run frees its slot (it is held), so without this the
        next run of ``provider`` would be offered at once and refused alike,
        one claim transaction after another, each taking the fleet lock.
        """
        self._closed.add(provider)

    def reopen(self) -> None:
        """A poll brought the fleet's accounts and queue: every provider may try again."""
        self._closed.clear()

    def gate(self, inner: StartGate) -> StartGate:
        """``inner`` (the account gate), with the providers closed since the last poll shut."""
        return _ClosedProviders(inner, self._closed) if self._closed else inner

    # -- status --------------------------------------------------------------

    def read_view(self, store: Store) -> FleetView:
        """Ledger operation: the fleet as the ledger knows it (three reads, no lock)."""
        del store  # the ledger hands over the store it was given: self.store
        return self.store.view()

    # -- claims and the lease ------------------------------------------------

    @staticmethod
    def rules(config: Config) -> ClaimRules:
        """What a claim checks fleet-wide, from the configuration in force."""
        from herdsman.runtime.store.fleet import ClaimRules  # noqa: PLC0415 - psycopg

        return ClaimRules(
            agent_exclusive=config.scheduling.agent_exclusive,
            provider_caps=dict(config.fleet.provider_caps),
            account_caps={
                (provider, account): cap
                for provider, accounts in config.fleet.account_caps.items()
                for account, cap in accounts.items()
            },
            account_budgets=claim_budgets(config),
        )

    @staticmethod
    def refusals(result: ClaimResult) -> list[tuple[str, Refused]]:
        """Each refused run of ``result``, and what the member does with it."""
        from herdsman.runtime.store.fleet import Refusal  # noqa: PLC0415 - psycopg

        lanes = (Refusal.LANE_BUSY, Refusal.EARLIER_QUEUED)  # the rest are about capacity
        return [
            (
                run_id,
                Refused.GONE
                if refusal is Refusal.GONE
                else Refused.LANE
                if refusal in lanes
                else Refused.CAP,
            )
            for run_id, refusal in result.refused
        ]

    async def keep_lease(
        self,
        ledger: Ledger,
        config: Callable[[], Config],
        wall: Callable[[], float],
        on_expired: Callable[[str], None],
    ) -> None:
        """Renew the lease and expire lapsed members, about three times per lease.

        Returns after calling ``on_expired(message)`` once, when the lease is
        found lapsed or the fence has fallen (its deadline passed before a
        renewal came back, or its keeper died): either way this member's
        agents are being killed and its runs may be declared lost. A ledger
        that fails otherwise is tried again at the next turn.
        """
        async with trio.open_nursery() as nursery:

            def expired(message: str) -> None:
                # Once: the renewal and the fence may both end in one batch.
                if not nursery.cancel_scope.cancel_called:
                    nursery.cancel_scope.cancel()
                    on_expired(message)

            nursery.start_soon(self._renew_loop, ledger, config, wall, expired)
            if self.fence is not None:
                nursery.start_soon(self._watch_fence, self.fence, expired)

    async def _watch_fence(self, fence: FenceLine, expired: Callable[[str], None]) -> None:
        why = await fence.wait_fallen()
        expired(
            f"the fence of this fleet member ({self.store.member_id}) fell: {why}; it stops"
            " its agents and starts nothing more, and other members may declare its runs lost"
        )

    async def _renew_loop(
        self,
        ledger: Ledger,
        config: Callable[[], Config],
        wall: Callable[[], float],
        expired: Callable[[str], None],
    ) -> None:
        while True:
            lease = config().fleet.lease.total_seconds()
            try:
                end, lost = await ledger.call(partial(self._renew_and_expire, lease, wall()))
            except LeaseExpired as exc:
                expired(str(exc))
                return
            except StoreError as exc:
                # Nothing of the call was kept (the renewal shares its
                # transaction with the expiry): the fence keeps its deadline.
                log.error("could not renew the fleet lease: %s", exc)
            else:
                # Only now is the renewal committed. Too late, the fence has
                # fallen, and the watcher says so.
                if self.fence is not None:
                    self.fence.extend(end)
                for record in lost:
                    log.warning(
                        "run %s: %s; recorded as lost, never re-run", record.id, record.reason
                    )
            await trio.sleep(lease / RENEWALS_PER_LEASE)

    def _renew_and_expire(
        self, lease: float, now: float, store: Store
    ) -> tuple[float, list[RunRecord]]:
        """Ledger operation: renew, then expire; the lease's local end, and the runs lost."""
        del store  # the ledger hands over the store it was given: self.store
        self.store.lease = lease  # a reload may have changed it
        self.store.renew()
        return self.store.lease_end_local, self.store.expire_lapsed(now)
