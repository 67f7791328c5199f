"""A PostgreSQL COMMIT whose answer is lost: the API must not say the run was not recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
import trio
from commit_cut_proxy import CommitCutProxy
from served_api import served_api
from supervisor_support import config_at, write_config

from herdsman.runtime.store.postgres import PostgresStore

RESTART = "herdsman does not reconnect to its ledger: restart the supervisor"


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[CommitCutProxy]:
    server = urlsplit(postgres_url)
    assert server.hostname is not None
    cutter = CommitCutProxy(server.hostname, server.port or 5432)
    yield cutter
    cutter.close()


@pytest.fixture
async def client(
    tmp_path: Path, postgres_url: str, proxy: CommitCutProxy, nursery: trio.Nursery
) -> AsyncIterator[httpx.AsyncClient]:
    config = config_at(write_config(tmp_path, concurrency=1))
    config.supervisor.state_dir.mkdir(parents=True)
    server = urlsplit(postgres_url)
    proxied = server._replace(netloc=f"{server.username}:{server.password}@127.0.0.1:{proxy.port}")
    store = PostgresStore(proxied.geturl(), sole=True)
    async with served_api(config, store, nursery) as (_, http):
        yield http


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
        f'); {RESTART}, then submit it again with the same id, "r1": a known id returns'
        " the existing run, so a retry never queues it twice"
    )
    # It was: the server committed before the answer was cut.
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT id FROM runs").fetchall() == [("r1",)]
    # The lost connection stays lost: every request says to restart, and a
    # retry cannot tell whether the first attempt was kept.
    again = await client.post("/v1/runs", json=body)
    assert again.status_code == 503
    assert again.json()["error"].startswith(
        "run r1 was not recorded by this request: the run ledger failed ("
    )
    listed = await client.get("/v1/runs")
    assert listed.status_code == 503
    assert listed.json()["error"].endswith(f"the connection is closed); {RESTART}, then ask again")
