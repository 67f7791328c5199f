"""A sole supervisor's finish that met a PostgreSQL server down for a moment is recorded.

The store connects again by itself, so the supervisor keeps running after
such an outage: a finish left unrecorded would keep its run ``running`` in
the ledger (and every client waiting for it waiting) until some later
restart, which may never come.
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

from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.supervisor import Supervisor


@attrs.define
class Served:
    """A supervisor whose PostgreSQL ledger is reached through a proxy, and its API."""

    supervisor: Supervisor
    client: httpx.AsyncClient
    store: PostgresStore


@pytest.fixture
async def served(
    tmp_path: Path, postgres_url: str, proxy: CommitCutProxy, nursery: trio.Nursery
) -> AsyncIterator[Served]:
    # Long enough that the run is still running when the server goes down.
    config = config_at(write_config(tmp_path, concurrency=1, delay=2))
    config.supervisor.state_dir.mkdir(parents=True)
    store = proxied_store(postgres_url, proxy)
    try:
        async with served_api(config, store, nursery) as (supervisor, http):
            yield Served(supervisor, http, store)
        await supervisor.finished.wait()
    finally:
        store.close()


async def test_a_finish_that_met_the_server_down_is_recorded_once_it_is_back(
    served: Served, proxy: CommitCutProxy, postgres_url: str
) -> None:
    client = served.client
    first = (await client.post("/v1/runs", json={"provider": "demo", "prompt": "x"})).json()
    run_id = first["id"]
    with trio.fail_after(30):
        while first["status"] != "running":
            await trio.sleep(0.02)
            first = (await client.get(f"/v1/runs/{run_id}")).json()
    # The server goes down: the session ends, and no new one is let in.
    proxy.refuse = True
    with psycopg.connect(postgres_url, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (served.store._conn.info.backend_pid,))
    # The run ends meanwhile; its finish cannot be recorded (the ledger is
    # asked nothing else, so only the finish meets the outage).
    with trio.fail_after(30):
        while served.supervisor.run_state(run_id) is not None:
            await trio.sleep(0.02)
    proxy.refuse = False  # the server is back
    # Answered 503 until the store's pause after the failed reconnect is over.
    with trio.fail_after(30):
        while (
            answer := await client.get(f"/v1/runs/{run_id}", params={"wait": 10})
        ).status_code == 503:
            await trio.sleep(0.1)
    ended = answer.json()
    assert (ended["status"], ended["attempts"]) == ("succeeded", 1)
    assert served.supervisor.fatal is None
