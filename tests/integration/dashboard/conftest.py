"""Fixtures of the dashboard's tests: a supervisor served in the test's trio run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from dashboard_support import write_config

from herdsman.runtime.main import Serving, serve
from herdsman.runtime.reload import ConfigSource


@attrs.define
class Served:
    """A supervisor serving its API and dashboard, and clients for both."""

    serving: Serving
    directory: Path
    token: str
    api: httpx.AsyncClient
    url: str

    def browser(self) -> httpx.AsyncClient:
        """A client with no token and no cookie, as a browser starts."""
        return httpx.AsyncClient(base_url=self.url, timeout=30)

    @asynccontextmanager
    async def logged_in(self) -> AsyncIterator[httpx.AsyncClient]:
        """A client that logged in through the form, holding only the cookie it got."""
        async with self.browser() as client:
            answer = await client.post("/login", data={"token": self.token})
            assert answer.status_code == 303, answer.text
            yield client


@pytest.fixture
async def served(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Served]:
    """A supervisor on a gate provider of concurrency 1, its file reloadable.

    Runs still going at the end are stopped after the second of grace.
    """
    source = ConfigSource(write_config(tmp_path), environ={}, watch=False)
    loaded = source.load()
    config = loaded.config
    stopped = trio.Event()

    async def run(task_status: trio.TaskStatus[Serving]) -> None:
        try:
            await serve(
                config, handle_signals=False, source=source, loaded=loaded, task_status=task_status
            )
        finally:
            stopped.set()

    serving: Serving = await nursery.start(run)
    token = config.api.token_file.read_text().strip()
    url = serving.urls[0]
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as api:
        yield Served(serving, tmp_path, token, api, url)
    serving.supervisor.request_shutdown()
    await stopped.wait()
