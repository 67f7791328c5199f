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


#: How many bodies of the largest size (``api.max_body_bytes``) may be held
#: at once, all requests together. Decoding a body takes a few times its
#: size again, so this bounds the API's memory whatever the number of
#: clients; any number of small bodies fit beside a large one.
BODIES_AT_ONCE = 4


class BodyBudget:
    """The bytes of request bodies held at once, granted in the order asked.

    A request asks for its whole body's size before reading any of it (its
    ``Content-Length``, or the limit when it declares none) and gives it back
    once answered: no request holds part of the budget while it waits for
    the rest, so none can wait on another for ever. One that finds the
    budget spent waits behind those that asked before it (trio's lock is
    first come, first served). A body alone is always granted, whatever the
    capacity, so a lowered capacity cannot stop everything.
    """

    def __init__(self) -> None:
        self.held = 0
        self._turn = trio.Lock()
        self._given_back = trio.Event()

    def fits(self, size: int, capacity: int) -> bool:
        """Whether ``size`` would be granted at once."""
        return not self._turn.locked() and self._room(size, capacity)

    def _room(self, size: int, capacity: int) -> bool:
        return not self.held or self.held + size <= capacity

    async def take(self, size: int, capacity: int) -> None:
        """Wait until ``size`` bytes fit within ``capacity``, then hold them."""
        if self.fits(size, capacity):
            # Granted without taking the turn: a lock taken even briefly
            # yields while held, so bodies asking at once would each wait a
            # scheduling round for the one before, and on a loaded machine
            # the last could pass its deadline (503) with room to spare.
            self.held += size
            return
        async with self._turn:
            while not self._room(size, capacity):
                # Only the holder of the turn waits for this event.
                self._given_back = trio.Event()
                await self._given_back.wait()
            self.held += size

    def give(self, size: int) -> None:
        """Give back what :meth:`take` granted."""
        self.held -= size
        self._given_back.set()


class BodyLimits:
    """ASGI middleware: a request body larger than ``api.max_body_bytes``, or
    slower to arrive than ``api.body_timeout`` after the headers, is refused.

    The refusal is raised where the handler reads the body, as an
    :class:`HTTPException` (413 or 408) that the app answers as JSON; the
    server then closes the connection, whose unread rest it never reads.
    Bodies are read within a :class:`BodyBudget` of ``BODIES_AT_ONCE`` times
    the limit; a request that finds no room for its body by its deadline is
    answered 503. ``settings`` is read at each request, so a reload applies
    to the next one.
    """

    def __init__(self, app: ASGIApp, settings: Callable[[], ApiSettings]) -> None:
        self.app = app
        self._settings = settings
        self.budget = BodyBudget()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request with its ``receive`` bounded."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _BoundedBody(scope, receive, self._settings(), self.budget)
        try:
            await self.app(scope, body.receive, send)
        finally:
            body.give_back()


class _BoundedBody:
    """One request's body, read within its limits."""

    def __init__(
        self, scope: Scope, receive: Receive, settings: ApiSettings, budget: BodyBudget
    ) -> None:
        self._scope = scope
        self._receive = receive
        self._budget = budget
        self._limit = settings.max_body_bytes
        self._timeout = settings.body_timeout.total_seconds()
        # Measured from the headers (the app starts when they are complete),
        # not from the first read: a handler that is slow to read cannot
        # stretch a client's time, nor can a client dribbling the body.
        self._deadline = trio.current_time() + self._timeout
        self._declared = _declared_length(scope)
        self._held: int | None = None
        self._received = 0
        self._complete = False

    async def receive(self) -> Message:
        """The next ASGI message, or an :class:`HTTPException` refusing the body."""
        if self._complete:
            return await self._receive()
        if self._held is None:
            await self._hold()
        with trio.move_on_at(self._deadline):
            message = await self._receive()
            if message["type"] == "http.request":
                self._received += len(message.get("body", b""))
                if self._received > self._limit:
                    raise HTTPException(413, _too_large(self._limit, ""))
                self._complete = not message.get("more_body", False)
            return message
        self._log(
            "did not send the body of %s within %g s: answered 408, nothing was done", self._timeout
        )
        raise HTTPException(
            408,
            f"the request body did not arrive within {self._timeout:g} s of its headers"
            " (api.body_timeout)",
        )

    async def _hold(self) -> None:
        """Hold room for the whole body before reading any of it."""
        declared, limit = self._declared, self._limit
        if declared is not None and declared > limit:
            raise HTTPException(413, _too_large(limit, f" of {declared} bytes"))
        size = limit if declared is None else declared
        if not size:
            self._held = 0
            return
        capacity = BODIES_AT_ONCE * limit
        with trio.move_on_at(self._deadline):
            if not self._budget.fits(size, capacity):
                self._log(
                    "waits to send the body of %s: other bodies fill the %d bytes read at once",
                    capacity,
                )
            await self._budget.take(size, capacity)
            self._held = size
            return
        self._log(
            "found no room for the body of %s within %g s: answered 503, nothing was done",
            self._timeout,
        )
        raise HTTPException(
            503,
            f"other request bodies fill the {capacity} bytes the API reads at once"
            f" ({BODIES_AT_ONCE} times api.max_body_bytes) and left no room for this one within"
            f" {self._timeout:g} s (api.body_timeout): nothing was done; ask again",
        )

    def give_back(self) -> None:
        """Give back the room held, once the request has been answered."""
        if self._held:
            self._budget.give(self._held)
        self._held = 0

    def _log(self, what: str, *args: object) -> None:
        """One INFO line: the client, then ``what`` (``%s``: the request)."""
        log.info("%s " + what, _client(self._scope), _request_line(self._scope), *args)


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
