"""A lost PostgreSQL connection, through the API: made again, and never a run recorded twice.

A COMMIT whose answer is lost must not be said not to be recorded, nor be
applied again; a connection cut anywhere else is made again at once, the
batch it broke applied on the new one.
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

from herdsman.runtime.store import NewRun
from herdsman.runtime.store.errors import CommitOutcomeUnknown
from herdsman.runtime.store.postgres import PostgresStore

T0 = 1_700_000_000.0

RECONNECT = (
    "herdsman connects to its ledger again at a later request (pausing up to 30 s"
    " between attempts while the server cannot be reached)"
)


@attrs.define
class Served:
    """A supervisor whose PostgreSQL ledger is reached through ``proxy``, and its API."""

    client: httpx.AsyncClient
    store: PostgresStore
    url: str

    def cut(self) -> None:
        """End the ledger's session on the server, as a server restart does."""
        with psycopg.connect(self.url, autocommit=True) as other:
            pid = self.store._conn.info.backend_pid
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
async def served(
    tmp_path: Path, postgres_url: str, proxy: CommitCutProxy, nursery: trio.Nursery
) -> AsyncIterator[Served]:
    config = config_at(write_config(tmp_path, concurrency=1, delay=0.5))
    config.supervisor.state_dir.mkdir(parents=True)
    store = proxied_store(postgres_url, proxy)
    try:
        async with served_api(config, store, nursery) as (supervisor, http):
            yield Served(http, store, postgres_url)
        await supervisor.finished.wait()
    finally:
        store.close()


@pytest.fixture
def client(served: Served) -> httpx.AsyncClient:
    return served.client


async def test_a_submit_whose_commit_answer_was_lost_may_have_been_recorded(
    client: httpx.AsyncClient, proxy: CommitCutProxy, postgres_url: str
) -> None:
    proxy.armed = True
    body = {"id": "r1", "provider": "demo", "prompt": "hello"}
    refused = await client.post("/v1/runs", json=body)
    assert proxy.cut.is_set()
    assert refused.status_code == 503
    answer = refused.json()
    assert answer["ids"] == ["r1"]
    assert answer["error"].startswith("run r1 may have been recorded: the run ledger failed (")
    assert "the connection was lost after COMMIT was sent" in answer["error"]
    assert answer["error"].endswith(
        f'); {RECONNECT}: submit it again with the same id, "r1": a known id returns'
        " the existing run, so a retry never queues it twice"
    )
    # It was: the server committed before the answer was cut.
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT id FROM runs").fetchall() == [("r1",)]
    # The connection is made again at the next request, which finds the run:
    # a retry with the same id is answered with it, and records nothing.
    again = await client.post("/v1/runs", json=body)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == "r1"
    listed = await client.get("/v1/runs")
    assert listed.status_code == 200
    assert [run["id"] for run in listed.json()["runs"]] == ["r1"]


def test_a_batch_whose_commit_answer_was_lost_is_not_applied_again(
    postgres_url: str, proxy: CommitCutProxy
) -> None:
    store = proxied_store(postgres_url, proxy)
    try:
        store.submit(NewRun(id="a", provider="demo", prompt="x"), T0)
        proxy.armed = True
        # An operation that is no idempotent: applied twice, it would note twice.
        with pytest.raises(CommitOutcomeUnknown):
            store.apply(
                [
                    lambda s: s.submit(NewRun(id="b", provider="demo", prompt="x"), T0),
                    lambda s: s.add_note("a", "once"),
                ]
            )
        assert proxy.cut.is_set()
        with psycopg.connect(postgres_url) as conn:
            rows = conn.execute("SELECT id, notes FROM runs ORDER BY seq").fetchall()
        assert rows == [("a", '["once"]'), ("b", "[]")]
        # The caller reads the outcome on the connection made again.
        record = store.get("a")
        assert record is not None
        assert record.notes == ("once",)
    finally:
        store.close()


async def test_an_idle_supervisor_whose_connection_was_cut_answers_the_next_request(
    served: Served,
) -> None:
    served.cut()
    created = await served.client.post("/v1/runs", json={"provider": "demo", "prompt": "x"})
    assert created.status_code == 201, created.text
    ended = await served.client.get(f"/v1/runs/{created.json()['id']}", params={"wait": 30})
    assert (ended.json()["status"], ended.json()["attempts"]) == ("succeeded", 1)


async def test_a_run_whose_connection_was_cut_while_it_ran_is_recorded_once(
    served: Served,
) -> None:
    body = {"provider": "demo", "prompt": "x", "conversation": "c"}
    first = (await served.client.post("/v1/runs", json={**body, "id": "first"})).json()
    with trio.fail_after(30):
        while first["status"] != "running":
            await trio.sleep(0.02)
            first = (await served.client.get("/v1/runs/first")).json()
    second = await served.client.post("/v1/runs", json={**body, "id": "second"})
    assert second.status_code == 201, second.text
    served.cut()
    # Its finish and the next start on its lane meet the dead connection:
    # applied on a new one, once; the ledger never goes lost or refuses.
    ended = [
        (await served.client.get(f"/v1/runs/{run_id}", params={"wait": 30})).json()
        for run_id in ("first", "second")
    ]
    assert [(r["status"], r["attempts"]) for r in ended] == [("succeeded", 1)] * 2
    status = (await served.client.get("/v1/status")).json()
    assert status["admitting"] is True


async def test_a_submit_whose_commit_answer_was_lost_and_was_kept_runs(
    client: httpx.AsyncClient, proxy: CommitCutProxy
) -> None:
    proxy.armed = True
    body = {"id": "r1", "provider": "demo", "prompt": "hello"}
    refused = await client.post("/v1/runs", json=body)
    assert proxy.cut.is_set()
    assert refused.status_code == 503, refused.text
    # Submitted again as the answer says: the run the ledger kept is the
    # one queued, and it runs (not left queued in the ledger alone).
    again = await client.post("/v1/runs", json=body)
    assert again.status_code == 200, again.text
    ended = (await client.get("/v1/runs/r1", params={"wait": 20})).json()
    assert (ended["status"], ended["attempts"]) == ("succeeded", 1)
