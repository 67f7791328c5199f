"""The body limit refuses exactly the bodies longer than it, however they are cut up."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import trio
from hypothesis import given
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message

from herdsman.config import ApiSettings
from herdsman.runtime.api.app import http_error
from herdsman.runtime.api.limits import BodyLimits

LIMIT = 100


async def echo(request: Request) -> Response:
    return Response(await request.body())


def app() -> Starlette:
    settings = ApiSettings(
        token_file=Path("unused"), max_body_bytes=LIMIT, body_timeout=timedelta(seconds=30)
    )
    return Starlette(
        routes=[Route("/", echo, methods=["POST"])],
        middleware=[Middleware(BodyLimits, settings=lambda: settings)],
        exception_handlers={Exception: http_error},
    )


def post(chunks: list[bytes], declared: int | None) -> tuple[int, bytes]:
    """The status and body a POST of ``chunks`` is answered with."""
    messages: list[Message] = [
        {"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks
    ]
    messages.append({"type": "http.request", "body": b"", "more_body": False})
    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 1),
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    trio.run(app(), scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


@given(st.lists(st.binary(max_size=40), max_size=8), st.booleans())
def test_a_body_is_refused_if_and_only_if_it_is_longer_than_the_limit(
    chunks: list[bytes], declare: bool
) -> None:
    whole = b"".join(chunks)
    status, body = post(chunks, len(whole) if declare else None)
    if len(whole) > LIMIT:
        assert status == 413
    else:
        assert (status, body) == (200, whole)


def test_a_declared_length_over_the_limit_is_refused_on_the_declaration_alone() -> None:
    # No chunk is ever given: the refusal cannot have waited for one.
    assert post([], LIMIT + 1)[0] == 413
