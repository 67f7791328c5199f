"""The body limit refuses exactly the bodies longer than it, however they are cut up;
the budget of bodies read at once grants them in order, within its capacity."""

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
from trio.testing import MockClock

from herdsman.config import ApiSettings
from herdsman.runtime.api.app import http_error
from herdsman.runtime.api.limits import BODIES_AT_ONCE, BodyBudget, BodyLimits

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


@given(
    st.integers(1, 200),
    st.lists(st.tuples(st.integers(1, 250), st.integers(1, 5)), min_size=1, max_size=12),
)
def test_the_budget_grants_in_the_order_asked_and_never_beyond_its_capacity(
    capacity: int, asks: list[tuple[int, int]]
) -> None:
    budget = BodyBudget()
    granted: list[int] = []
    holders: list[int] = []

    async def body(index: int, size: int, hold: int) -> None:
        # Each asks at its own instant: no order rests on a tie.
        await trio.sleep(index * 0.01)
        await budget.take(size, capacity)
        granted.append(index)
        holders.append(size)
        # Beyond the capacity only when alone: a body alone always fits.
        assert budget.held <= capacity or len(holders) == 1
        await trio.sleep(hold)
        holders.remove(size)
        budget.give(size)

    async def main() -> None:
        # Virtual time: every body is done long before, unless one waits for ever.
        with trio.fail_after(10_000):
            async with trio.open_nursery() as nursery:
                for index, (size, hold) in enumerate(asks):
                    nursery.start_soon(body, index, size, hold)

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert granted == list(range(len(asks)))
    assert budget.held == 0


def test_bodies_asking_at_once_with_room_for_all_are_granted_without_waiting_their_turn() -> None:
    # A loaded machine, where each scheduling round takes long: here each
    # takes 0.1 s of virtual time. Forty small bodies with a second to find
    # room (api.body_timeout) ask at once: none may wait behind another.
    clock = MockClock()
    budget = BodyBudget()
    granted: list[int] = []

    async def ask(index: int) -> None:
        with trio.move_on_after(1.0):
            await budget.take(10, BODIES_AT_ONCE * LIMIT)
            granted.append(index)

    async def slow_rounds() -> None:
        while True:
            clock.jump(0.1)
            await trio.sleep(0)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_rounds)
            async with trio.open_nursery() as askers:
                for index in range(40):
                    askers.start_soon(ask, index)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert sorted(granted) == list(range(40))
    assert budget.held == 40 * 10
