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

#: How long a connection may stay without a request before it is closed:
#: from connecting (or from the previous answer) until the request's headers
#: are complete. Every HTTP client sends its headers at once; one that is
#: idle longer opens a new connection (httpx does so by itself).
HEADER_TIMEOUT = 5.0

#: How long a connection may send nothing at all before it is closed. Longer
#: than any answer takes (a long poll waits at most 300 s), since the wait
#: for an answer counts: a client sends nothing meanwhile. It closes what
#: the header timeout misses: an HTTP/2 connection (hypercorn speaks it to a
#: client that opens with its preface) that never opens a stream.
SILENCE_TIMEOUT = 360.0


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
    header_timeout: float = HEADER_TIMEOUT,
    silence_timeout: float = SILENCE_TIMEOUT,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``listen`` until ``shutdown_trigger`` returns.

    ``task_status.started`` receives the bound URLs (useful with port 0).
    A connection's request headers must be complete within ``header_timeout``
    seconds of its start or of its previous answer, and a connection that
    sends nothing for ``silence_timeout`` seconds is closed; the body's time
    and size are bounded by the app (:mod:`herdsman.runtime.api.limits`).
    """
    config = HypercornConfig()
    config.bind = [listen]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 5.0
    # hypercorn's keep-alive timer runs from the connection's start (or the
    # previous answer) until a request's headers are complete: it is the
    # headers' deadline, not reset by each byte of them.
    config.keep_alive_timeout = header_timeout
    # Headers still incomplete after this many bytes are refused (431):
    # hypercorn's default, set here so the documented bound is visibly ours.
    config.h11_max_incomplete_size = 16 * 1024
    # hypercorn's read timeout bounds each wait for the client's next bytes,
    # the wait while a request is being answered included.
    config.read_timeout = silence_timeout  # type: ignore[assignment]
    # Starlette is an ASGI app; hypercorn's type is a narrower structural alias.
    framework = cast("ASGIFramework", app)
    await serve(framework, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
