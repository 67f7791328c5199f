"""A cancel whose COMMIT answer was lost, through the API: cancelled or queued, never both.

The cancel may have been recorded. A supervisor that put the run back in
its queue regardless would, once the run's lane freed, try to start a run
the ledger has cancelled: the start is refused, and a refused start stops
the supervisor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import httpx
import psycopg
import pytest
import trio
from commit_cut_proxy import CommitCutProxy, proxied_store
from served_api import served_api
from supervisor_support import config_at, write_config

from herdsman.runtime.supervisor import Supervisor


@attrs.define
class Served:
    """A supervisor whose PostgreSQL ledger is reached through a proxy, and its API."""

    supervisor: Supervisor
    client: httpx.AsyncClient


@pytest.fixture
async def served(
    tmp_path: Path, postgres_url: str, proxy: CommitCutProxy, nursery: trio.Nursery
) -> AsyncIterator[Served]:
    # Runs long enough that the first is still running when the cancel is sent.
    config = config_at(write_config(tmp_path, concurrency=1, delay=3))
    config.supervisor.state_dir.mkdir(parents=True)
    store = proxied_store(postgres_url, proxy)
    try:
        async with served_api(config, store, nursery) as (supervisor, http):
            yield Served(supervisor, http)
        await supervisor.finished.wait()
    finally:
        store.close()


async def test_a_cancel_whose_commit_answer_was_lost_is_read_back_and_the_run_never_started(
    served: Served, proxy: CommitCutProxy, postgres_url: str
) -> None:
    client = served.client
    body = {"provider": "demo", "prompt": "x", "conversation": "c"}
    first = (await client.post("/v1/runs", json={**body, "id": "first"})).json()
    with trio.fail_after(30):
        while first["status"] != "running":
            await trio.sleep(0.02)
            first = (await client.get("/v1/runs/first")).json()
    # Queued behind the first, on its conversation's lane.
    second = await client.post("/v1/runs", json={**body, "id": "second"})
    assert second.status_code == 201, second.text
    proxy.trigger, proxy.armed = b"UPDATE RUNS", True
    cancel = await client.post("/v1/runs/second/cancel")
    assert proxy.cut.is_set()
    # The server committed the cancel before its answer was cut: read back,
    # it is answered as recorded.
    assert cancel.status_code == 200, cancel.text
    assert cancel.json()["status"] == "cancelled"
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT status FROM runs WHERE id = 'second'").fetchone()
    assert row == ("cancelled",)
    ended = (await client.get("/v1/runs/first", params={"wait": 30})).json()
    assert ended["status"] == "succeeded"
    # The first's finish freed the lane: the cancelled run must not be
    # started (the ledger would refuse it, and the supervisor stop).
    status = (await client.get("/v1/status")).json()
    assert status["admitting"] is True, status
    assert served.supervisor.fatal is None
    after = (await client.get("/v1/runs/second")).json()
    assert after["status"] == "cancelled"
    later = await client.post("/v1/runs", json={**body, "id": "third"})
    assert later.status_code == 201, later.text
    done = (await client.get("/v1/runs/third", params={"wait": 30})).json()
    assert done["status"] == "succeeded"


async def test_a_cancel_whose_commit_was_lost_unsent_is_read_back_and_the_run_put_back(
    served: Served, proxy: CommitCutProxy, postgres_url: str
) -> None:
    client = served.client
    body = {"provider": "demo", "prompt": "x", "conversation": "c"}
    first = (await client.post("/v1/runs", json={**body, "id": "first"})).json()
    with trio.fail_after(30):
        while first["status"] != "running":
            await trio.sleep(0.02)
            first = (await client.get("/v1/runs/first")).json()
    second = await client.post("/v1/runs", json={**body, "id": "second"})
    assert second.status_code == 201, second.text
    proxy.trigger, proxy.drop_commit, proxy.armed = b"UPDATE RUNS", True, True
    cancel = await client.post("/v1/runs/second/cancel")
    assert proxy.cut.is_set()
    # The server never got the COMMIT: read back, the run is still queued,
    # so it is put back, and the cancel may be asked for again.
    assert cancel.status_code == 503, cancel.text
    assert "it is still queued: ask again" in cancel.json()["error"]
    ended = [
        (await client.get(f"/v1/runs/{run_id}", params={"wait": 20})).json()
        for run_id in ("first", "second")
    ]
    assert [(r["status"], r["attempts"]) for r in ended] == [("succeeded", 1)] * 2
    assert served.supervisor.fatal is None
