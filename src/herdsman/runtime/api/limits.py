"""What one request's body may cost: its size, the time it takes to arrive, a hang-up.

hypercorn bounds the rest of a request (see :func:`~herdsman.runtime.api.server.serve_api`).
The body is bounded here, where it is read: a handler reads it only after
the bearer token was checked, so a client without the token never gets a
byte of its body buffered. Nothing here reads ahead: a body refused for its
declared size is refused before any of it is received, and a chunked body is
counted as it arrives, so at most the limit (and one network read) is ever
held for a request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from herdsman.config import ApiSettings

log = logging.getLogger("herdsman.api")


class BodyLimits:
    """ASGI middleware: a request body larger than ``api.max_body_bytes``, or
    slower to arrive than ``api.body_timeout`` after the headers, is refused.

    The refusal is raised where the handler reads the body, as an
    :class:`HTTPException` (413 or 408) that the app answers as JSON; the
    server then closes the connection, whose unread rest it never reads.
    ``settings`` is read at each request, so a reload applies to the next one.
    """

    def __init__(self, app: ASGIApp, settings: Callable[[], ApiSettings]) -> None:
        self.app = app
        self._settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request with its ``receive`` bounded."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self._settings()
        limit = settings.max_body_bytes
        timeout = settings.body_timeout.total_seconds()
        # Measured from the headers (the app starts when they are complete),
        # not from the first read: a handler that is slow to read cannot
        # stretch a client's time, nor can a client dribbling the body.
        deadline = trio.current_time() + timeout
        declared = _declared_length(scope)
        received = 0
        complete = False

        async def bounded_receive() -> Message:
            nonlocal received, complete
            if complete:
                return await receive()
            if declared is not None and declared > limit:
                raise HTTPException(413, _too_large(limit, f" of {declared} bytes"))
            with trio.move_on_at(deadline):
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > limit:
                        raise HTTPException(413, _too_large(limit, ""))
                    complete = not message.get("more_body", False)
                return message
            log.info(
                "%s did not send the body of %s within %g s: answered 408, nothing was done",
                _client(scope),
                _request_line(scope),
                timeout,
            )
            raise HTTPException(
                408,
                f"the request body did not arrive within {timeout:g} s of its headers"
                " (api.body_timeout)",
            )

        await self.app(scope, bounded_receive, send)


def _too_large(limit: int, size: str) -> str:
    return f"the request body{size} is larger than the limit of {limit} bytes (api.max_body_bytes)"


def _declared_length(scope: Scope) -> int | None:
    """The body length the headers declare (the server has checked it is a number)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "a client"


def _request_line(scope: Scope) -> str:
    """Method and path, on one line whatever the path holds (it is percent-decoded)."""
    path: str = scope["path"]
    return f"{scope['method']} {path if path.isprintable() else ascii(path)}"


async def client_hung_up(request: Request, exc: Exception) -> Response:
    """A client that closed its connection before its body was complete: one line.

    No handler acted (each reads the whole body first), and nobody is left
    to read an answer: the empty response goes nowhere.
    """
    assert isinstance(exc, ClientDisconnect)
    log.info(
        "%s hung up before its request body was complete: %s, nothing was done",
        _client(request.scope),
        _request_line(request.scope),
    )
    return Response(status_code=400)
