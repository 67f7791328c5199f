"""Shutdown racing with the ledger: every run that reached the store ends recorded."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import outcome
import trio
from supervisor_support import config_at, write_config

from herdsman.runtime.store import MemoryStore, NewRun, RunStatus, Store
from herdsman.runtime.supervisor import Supervisor


class GatedStore(MemoryStore):
    """Holds every durable batch (a start) until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.durable_waiting = threading.Event()
        self.gate = threading.Event()

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        if durable:
            self.durable_waiting.set()
            self.gate.wait(timeout=30)
        return super().apply(operations, durable=durable)


async def test_cancelling_the_supervisor_during_a_start_commit_records_the_run(
    tmp_path: Path,
) -> None:
    config = config_at(write_config(tmp_path, delay=30))
    store = GatedStore()
    supervisor = Supervisor(config, store)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x"))
        await trio.to_thread.run_sync(store.durable_waiting.wait)
        nursery.cancel_scope.cancel()  # the start commit is in flight
        store.gate.set()
    record = store.get("r1")
    assert record is not None
    # Committed as running, then its task was cancelled before or just after
    # the spawn: recorded as cancelled, never left running, never re-run.
    assert record.status is RunStatus.CANCELLED
    assert record.attempts == 1
