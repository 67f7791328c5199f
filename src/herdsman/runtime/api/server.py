"""Serving the API on loopback with hypercorn's trio worker, and its token."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from starlette.applications import Starlette

from herdsman.runtime.state_paths import PRIVATE_DIR, private_opener

if TYPE_CHECKING:
    from hypercorn.typing import ASGIFramework

log = logging.getLogger("herdsman.api")


def ensure_token(path: Path) -> str:
    """Read the bearer token, creating it (mode 0600) on first start.

    The file is never reached through a link at its own name (the token
    would be read from, or written to, wherever it pointed).
    """
    try:
        token = _read_token(path)
    except FileNotFoundError:
        token = ""
    if token:
        return token
    path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    # O_EXCL: if two processes race, the loser re-reads the winner's token.
    try:
        fd = private_opener(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return _read_token(path)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    return token


def _read_token(path: Path) -> str:
    with open(path, encoding="utf-8", opener=private_opener) as handle:
        return handle.read(4096).strip()


async def serve_api(
    app: Starlette,
    listen: str,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``listen`` until ``shutdown_trigger`` returns.

    ``task_status.started`` receives the bound URLs (useful with port 0).
    """
    config = HypercornConfig()
    config.bind = [listen]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 5.0
    # Starlette is an ASGI app; hypercorn's type is a narrower structural alias.
    framework = cast("ASGIFramework", app)
    await serve(framework, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
