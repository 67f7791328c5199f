"""A supervisor on a given store, served through its real HTTP API, and a client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import httpx
import trio

from herdsman.config import Config
from herdsman.runtime.api.app import create_app
from herdsman.runtime.api.server import HEADER_TIMEOUT, SILENCE_TIMEOUT, ensure_token, serve_api
from herdsman.runtime.main import token_path
from herdsman.runtime.store import Store
from herdsman.runtime.supervisor import Supervisor


@asynccontextmanager
async def served_api(
    config: Config,
    store: Store,
    nursery: trio.Nursery,
    *,
    listen: str | None = None,
    header_timeout: float = HEADER_TIMEOUT,
    silence_timeout: float = SILENCE_TIMEOUT,
) -> AsyncIterator[tuple[Supervisor, httpx.AsyncClient]]:
    """Run a supervisor on ``store`` and its API in ``nursery``; stop both on leaving.

    The API listens on ``listen`` (``"127.0.0.1:0"``: a port the system picks),
    else on ``api.listen``; the client's base URL is where it listens.
    """
    supervisor = Supervisor(config, store)
    token = ensure_token(token_path(config))
    stopped = trio.Event()
    await nursery.start(supervisor.run)
    app = create_app(supervisor, token)
    urls = await nursery.start(
        partial(
            serve_api,
            app,
            listen or config.api.listen,
            shutdown_trigger=stopped.wait,
            header_timeout=header_timeout,
            silence_timeout=silence_timeout,
        )
    )
    async with httpx.AsyncClient(
        base_url=urls[0], headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as client:
        yield supervisor, client
    stopped.set()
    supervisor.request_shutdown()
