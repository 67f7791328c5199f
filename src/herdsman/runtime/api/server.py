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

if TYPE_CHECKING:
    from hypercorn.typing import ASGIFramework

log = logging.getLogger("herdsman.api")


def ensure_token(path: Path) -> str:
    """Read the bearer token, creating it (mode 0600) on first start."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    # O_EXCL: if two processes race, the loser re-reads the winner's token.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text(encoding="utf-8").strip()
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    return token


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
