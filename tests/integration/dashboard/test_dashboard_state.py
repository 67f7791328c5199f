"""What a snapshot holds when the run ledger cannot be read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from dashboard_support import write_config

from herdsman.config import load_config
from herdsman.runtime.dashboard.snapshot import read_state
from herdsman.runtime.store import MemoryStore, RunRecord, StoreError
from herdsman.runtime.supervisor import Supervisor


class UnreadableStore(MemoryStore):
    """A ledger whose listings fail once ``broken`` is set, as an unreachable server's do."""

    broken = False

    def list_runs(self, **filters: Any) -> list[RunRecord]:
        if self.broken:
            raise StoreError("run ledger: the server closed the connection")
        return super().list_runs(**filters)


async def test_a_failing_ledger_empties_the_lists_and_says_why(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    config = load_config(write_config(tmp_path), environ={}).config
    store = UnreadableStore()
    supervisor = Supervisor(config, store)
    await nursery.start(supervisor.run)
    state = await read_state(supervisor)
    assert state["ledger_error"] is None
    store.broken = True
    state = await read_state(supervisor)
    assert (state["running"], state["queued"], state["recent"]) == ([], [], [])
    assert state["ledger_error"] == (
        "the run ledger failed (run ledger: the server closed the connection);"
        " nothing changed: ask again"
    )
    # What the supervisor knows without its ledger is still there.
    assert state["status"]["limits"]["providers"] == {"gate": 1}
    supervisor.request_shutdown()
