"""The ledger a simulated fleet shares: its runs, members, holders, requests, marks and clock.

:class:`SimFleet` is the database itself; each member's connection to it is a
:class:`~herdsman.sim.fleet_store.SimFleetStore` (see that module for why it
is right without a lock). The runs live in a :class:`MemoryStore`, whose undo
log the fleet's own tables share, so a failed call takes back all it changed.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from herdsman.runtime.store.errors import StoreConflict
from herdsman.runtime.store.fleet import FENCE_MARGIN, Member
from herdsman.runtime.store.memory import MemoryStore
from herdsman.runtime.store.records import RunRecord, RunStatus

if TYPE_CHECKING:
    from herdsman.sim.fleet_store import SimFleetStore

__all__ = ["SimFleet"]

_RUNNING: Final = RunStatus.RUNNING
_QUEUED: Final = RunStatus.QUEUED


class _Runs(MemoryStore):
    """The fleet's runs: a :class:`MemoryStore` whose undo log the fleet's tables share."""

    def keep(self, mapping: MutableMapping[Any, Any], key: Any) -> None:
        """Remember ``mapping[key]`` before a change, to put it back if the call fails."""
        if self._undo is not None:
            self._undo.keep(mapping, key)

    @property
    def in_operation(self) -> bool:
        """Whether an operation (a call made all or nothing) is applying now."""
        return self._undo is not None

    def draw_mark(self) -> int:
        """The next number of ``seq``'s counter, for a re-queue mark (see ``FleetStore.poll``)."""
        self._last_seq += 1
        return self._last_seq

    def put(self, record: RunRecord) -> None:
        """Store ``record`` over the run's last one (undone with the call that made it)."""
        self._put(record)
        self._ended(record)

    def records(self) -> list[RunRecord]:
        """Every run, in ``seq`` order."""
        return list(self._runs.values())

    def keep_attempt(
        self, current: RunRecord, failure: str | None, retry_at: float | None, held_by: str | None
    ) -> None:
        """Keep the attempt ``current`` holds before a re-queue clears it, run by ``held_by``."""
        self._keep_attempt(current, failure, retry_at, held_by)


class SimFleet:
    """The ledger a simulated fleet shares: runs, members, holders, requests, marks, clock.

    ``clock`` is the ledger server's clock (unix seconds), the one lease
    times are on; ``local_clock`` the clock a member's fence reads
    (``fence_clock`` in production). Under the simulator both follow trio's
    clock, so a member's local lease end is exactly the ledger's.
    """

    def __init__(
        self, clock: Callable[[], float], local_clock: Callable[[], float] | None = None
    ) -> None:
        """An empty ledger whose leases are on ``clock``."""
        self.clock = clock
        self.local_clock = local_clock if local_clock is not None else clock
        self.runs = _Runs()
        self.members: dict[str, Member] = {}
        #: The member that last claimed each run (kept after it ends, as ``held_by``).
        self.holders: dict[str, str] = {}
        #: ``cancel_request``: the first reason a cancel was asked of the holder with.
        self.cancel_requests: dict[str, str] = {}
        #: ``requeue_mark``: drawn from ``seq``'s counter when a run is re-queued.
        self.marks: dict[str, int] = {}

    def join(
        self,
        member_id: str,
        *,
        host: str,
        pid: int,
        lease: float,
        margin: float = FENCE_MARGIN,
    ) -> SimFleetStore:
        """A member's connection: the member joins with a lease of ``lease`` seconds."""
        # Imported here: the connection's module needs the ledger's at import.
        from herdsman.sim.fleet_store import SimFleetStore  # noqa: PLC0415

        return SimFleetStore(
            self, member_id=member_id, host=host, pid=pid, lease=lease, margin=margin
        )

    def held(self, run: RunRecord) -> str | None:
        """``held_by`` of ``run`` while it runs."""
        return self.holders.get(run.id) if run.status is _RUNNING else None

    def write(self, current: RunRecord, record: RunRecord, *, held_by: str | None) -> None:
        """``FleetStore``'s ``_write``: a running run changes only by its holder."""
        runs = self.runs
        if current.status is _RUNNING:
            if self.holders.get(current.id) != held_by:
                raise StoreConflict(
                    f"run {current.id!r} is no longer {current.status.value} on this"
                    f" supervisor; it cannot become {record.status.value} (another writer"
                    " changed it first)"
                )
        else:
            runs.keep(self.holders, current.id)
            if held_by is None:
                self.holders.pop(current.id, None)
            else:
                self.holders[current.id] = held_by
        runs.put(record)

    def live_on_lane(
        self, workspace: str, lane: str, key: str, *, before: int | None = None
    ) -> RunStatus | None:
        """``running`` if a run runs on the lane, else ``queued`` if one waits on it, else None."""
        found: RunStatus | None = None
        for run in self.runs.records():
            if run.workspace != workspace or getattr(run, lane) != key:
                continue
            if run.status is _RUNNING:
                return _RUNNING
            if run.status is _QUEUED and (before is None or run.seq < before):
                found = _QUEUED
        return found

    def running_count(self, provider: str, account: str | None = None, *, of_account: bool) -> int:
        """Running runs of ``provider`` (and, ``of_account``, spending ``account``)."""
        return sum(
            1
            for run in self.runs.records()
            if run.status is _RUNNING
            and run.provider == provider
            and (not of_account or run.account == account)
        )
