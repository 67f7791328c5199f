"""The two fleet ledgers the shared contract tests run against, behind one face.

``postgres``: members of a real PostgreSQL ledger (:class:`FleetStore`), whose
leases are on the server's clock, so time passes by sleeping. ``sim``: members
of the simulator's in-memory ledger (:class:`SimFleet`), whose clock the test
moves. A test asks for members and for time to pass, and never knows which.
"""

from __future__ import annotations

import time
import uuid

from herdsman.runtime.fleet_ports import FleetLedger
from herdsman.runtime.store.fleet import FleetStore
from herdsman.sim.fleet_store import SimFleet

__all__ = ["FleetUnderTest", "PostgresFleet", "SimulatedFleet"]


class FleetUnderTest:
    """Members of one ledger, and the passing of its clock."""

    def __init__(self) -> None:
        self._members: list[FleetLedger] = []

    def member(self, name: str, lease: float = 60.0, margin: float = 0.0) -> FleetLedger:
        """A member with host ``name`` and pid 100, its id beginning with ``name``.

        ``margin`` 0 by default: it expires others as soon as their lease ends,
        the ledger's own rules tested with short leases.
        """
        store = self._join(f"{name}-{uuid.uuid4().hex[:8]}", name, lease, margin)
        self._members.append(store)
        return store

    def _join(self, member_id: str, host: str, lease: float, margin: float) -> FleetLedger:
        raise NotImplementedError

    def pause(self, seconds: float) -> None:
        """Let at least ``seconds`` pass on the ledger's clock."""
        raise NotImplementedError

    def close(self) -> None:
        """Close every member's connection."""
        for store in self._members:
            store.close()


class PostgresFleet(FleetUnderTest):
    """Members of the PostgreSQL ledger at ``url``."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def _join(self, member_id: str, host: str, lease: float, margin: float) -> FleetLedger:
        return FleetStore(
            self.url, member_id=member_id, host=host, pid=100, lease=lease, margin=margin
        )

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)


class SimulatedFleet(FleetUnderTest):
    """Members of one in-memory simulated ledger, on a clock the test moves."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_800_000_000.0
        self.ledger = SimFleet(lambda: self.now)

    def _join(self, member_id: str, host: str, lease: float, margin: float) -> FleetLedger:
        return self.ledger.join(member_id, host=host, pid=100, lease=lease, margin=margin)

    def pause(self, seconds: float) -> None:
        self.now += seconds
