"""What the dashboard shows and answers when the run ledger cannot be read."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import trio
from dashboard_support import open_gate, write_config

from herdsman.config import load_config
from herdsman.runtime.api.app import create_app
from herdsman.runtime.dashboard.app import with_dashboard
from herdsman.runtime.dashboard.snapshot import Snapshots, read_state
from herdsman.runtime.store import MemoryStore, NewRun, RunRecord, StoreError
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


async def test_a_failing_ledger_is_a_503_for_the_pages_reads(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    config = load_config(write_config(tmp_path), environ={}).config
    store = UnreadableStore()
    supervisor = Supervisor(config, store)
    await nursery.start(supervisor.run)
    app = with_dashboard(create_app(supervisor, "t0ken"), supervisor, "t0ken")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://herd") as client:
        assert (await client.post("/login", data={"token": "t0ken"})).status_code == 303
        store.broken = True
        answer = await client.get("/dashboard/timeline")
        assert answer.status_code == 503
        assert answer.json()["error"].startswith("the run ledger failed (run ledger: the server")
        # Reading one run needs no listing; an unknown one is the API's 404.
        missing = await client.get("/dashboard/runs/nosuch/log")
        assert (missing.status_code, missing.json()) == (404, {"error": "no run with id 'nosuch'"})
    supervisor.request_shutdown()


async def test_a_start_no_request_caused_reaches_the_pages(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    """A run that starts when its account's rest runs out: nothing but the start says so."""
    extra = '[[providers.gate.accounts]]\nname = "only"\n'
    config = load_config(write_config(tmp_path, extra=extra), environ={}).config
    supervisor = Supervisor(config, MemoryStore())
    await nursery.start(supervisor.run)
    snapshots = Snapshots(
        supervisor.changes, lambda: read_state(supervisor), time.time, settle=0, min_gap=0
    )
    await supervisor.rest_account("gate", "only", time.time() + 1, "resting a moment")
    await supervisor.submit(NewRun(id="r1", provider="gate", prompt="r1", conversation="c"))
    number, payload = await snapshots.current()
    assert [run["id"] for run in json.loads(payload)["state"]["queued"]] == ["r1"]
    with trio.fail_after(30):
        while True:
            number, payload = await snapshots.after(number)
            if [run["id"] for run in json.loads(payload)["state"]["running"]] == ["r1"]:
                break
    open_gate(tmp_path, "r1")
    supervisor.request_shutdown()
