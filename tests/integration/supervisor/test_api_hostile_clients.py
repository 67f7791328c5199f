"""Hostile clients against the real HTTP API: hang-ups, huge and slow bodies, idle connections.

Each test serves a real supervisor on a port the system picks and talks to it
with raw sockets (for what no well-behaved client sends) or httpx. What the
server logs is checked too: one line per hang-up or slow body, no traceback.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from served_api import served_api
from supervisor_support import Start, config_at, write_config

from herdsman.runtime.api.limits import BODIES_AT_ONCE
from herdsman.runtime.main import DB_NAME, token_path
from herdsman.runtime.store import SqliteStore
from herdsman.runtime.supervisor import Supervisor

LIMIT = 131_072
#: Short timeouts so the tests need not wait long; the tests never assert how long.
LIMITS = f'max_body_bytes = {LIMIT}\nbody_timeout = "1s"'
HEADER_TIMEOUT = 0.5
SILENCE_TIMEOUT = 3.0
#: No answer in a test takes this long unless the server never gives it.
PATIENCE = 30
# A server's timers other than the one a test is about are as long as the
# test's patience: on a loaded machine a server reads what was sent at once
# seconds late, and a short header timeout would close a connection whose
# request had arrived whole, a short silence timeout one whose body was
# still within its time.


@attrs.define
class Served:
    """A supervisor, its API's port and token, and an httpx client for it."""

    supervisor: Supervisor
    client: httpx.AsyncClient
    port: int
    token: str

    async def connect(self, data: bytes = b"") -> trio.SocketStream:
        """A new connection that has sent ``data``."""
        stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        if data:
            await stream.send_all(data)
        return stream

    def head(self, method: str, path: str, *headers: str, auth: bool = True) -> bytes:
        """A request's head (request line and headers, ended)."""
        lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
        if auth:
            lines.append(f"Authorization: Bearer {self.token}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


@asynccontextmanager
async def serving(
    directory: Path,
    nursery: trio.Nursery,
    limits: str,
    *,
    header_timeout: float = PATIENCE,
    silence_timeout: float = PATIENCE,
) -> AsyncIterator[Served]:
    directory.mkdir(parents=True, exist_ok=True)
    config = config_at(write_config(directory, extra=limits))
    config.supervisor.state_dir.mkdir(parents=True)
    store = SqliteStore(config.supervisor.state_dir / DB_NAME)
    async with served_api(
        config,
        store,
        nursery,
        listen="127.0.0.1:0",
        header_timeout=header_timeout,
        silence_timeout=silence_timeout,
    ) as (supervisor, client):
        port = httpx.URL(str(client.base_url)).port
        assert port is not None
        token = token_path(config).read_text().strip()
        yield Served(supervisor, client, port, token)


@pytest.fixture
async def served(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Served]:
    async with serving(tmp_path, nursery, LIMITS) as served:
        yield served


@pytest.fixture
async def patient(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Served]:
    """As ``served``, with time enough for a test to finish a body itself."""
    async with serving(tmp_path, nursery, LIMITS.replace('"1s"', '"30s"')) as served:
        yield served


@pytest.fixture
def api_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="herdsman.api")
    return caplog


async def until_closed(stream: trio.SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    with trio.fail_after(PATIENCE):
        while True:
            try:
                chunk = await stream.receive_some(65_536)
            except trio.BrokenResourceError:  # a reset after the answer
                break
            if not chunk:
                break
            received += chunk
    await stream.aclose()
    return received


def status_and_body(answer: bytes) -> tuple[int, object]:
    """The status and the JSON body of one HTTP/1.1 answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)


def lines_with(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()
        assert "\n" not in record.getMessage()


async def logged(caplog: pytest.LogCaptureFixture, text: str, count: int) -> None:
    """Wait until ``count`` lines holding ``text`` were logged."""
    with trio.fail_after(PATIENCE):
        while len(lines_with(caplog, text)) < count:
            await trio.sleep(0.02)


HUNG_UP = "hung up before its request body was complete"
TOO_SLOW = "did not send the body of"


async def test_a_client_hanging_up_mid_body_is_one_log_line(
    served: Served, api_log: pytest.LogCaptureFixture
) -> None:
    head = served.head("POST", "/v1/runs", "Content-Length: 1000")
    for _ in range(20):
        stream = await served.connect(head + b'{"provider": "demo", "prom')
        await stream.aclose()
    await logged(api_log, HUNG_UP, 20)
    # The server is still serving, nothing was submitted, and nothing else was said.
    listed = await served.client.get("/v1/runs")
    assert listed.json() == {"runs": []}
    assert_no_traceback(api_log)
    [line, *_] = lines_with(api_log, HUNG_UP)
    assert line.getMessage().startswith("127.0.0.1:")
    assert line.getMessage().endswith(f"{HUNG_UP}: POST /v1/runs, nothing was done")
    assert len(lines_with(api_log, HUNG_UP)) == 20


async def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_sent(
    served: Served,
) -> None:
    # Only the head is sent: the answer cannot wait for the body.
    stream = await served.connect(served.head("POST", "/v1/runs", f"Content-Length: {LIMIT + 1}"))
    status, body = status_and_body(await until_closed(stream))
    assert status == 413
    assert body == {
        "error": f"the request body of {LIMIT + 1} bytes is larger than the limit of"
        f" {LIMIT} bytes (api.max_body_bytes)"
    }


async def test_a_chunked_body_is_refused_once_it_passes_the_limit(served: Served) -> None:
    stream = await served.connect(
        served.head("POST", "/v1/runs/batch", "Transfer-Encoding: chunked")
    )
    chunk = b"400\r\n" + b" " * 1024 + b"\r\n"

    async def send_forever() -> None:
        # Bounded: far more than the limit, and than the socket buffers hold.
        for _ in range(64 * 1024):
            try:
                await stream.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_forever)
        answer = await until_closed(stream)
    status, body = status_and_body(answer)
    assert status == 413
    assert body == {
        "error": f"the request body is larger than the limit of {LIMIT} bytes (api.max_body_bytes)"
    }
    assert (await served.client.get("/v1/runs")).json() == {"runs": []}


async def test_a_body_of_exactly_the_limit_is_accepted(served: Served) -> None:
    template = json.dumps({"provider": "demo", "prompt": "x", "id": "at-limit"})
    body = template.replace('"x"', '"x' + " " * (LIMIT - len(template)) + '"').encode()
    assert len(body) == LIMIT
    response = await served.client.post("/v1/runs", content=body)
    assert response.status_code == 201, response.text
    refused = await served.client.post("/v1/runs", content=body + b" ")
    assert refused.status_code == 413


async def test_a_body_too_slow_to_arrive_is_answered_408_and_closed(
    served: Served, api_log: pytest.LogCaptureFixture
) -> None:
    head = served.head("POST", "/v1/runs", "Content-Length: 100")
    stream = await served.connect(head + b'{"provider": ')
    status, body = status_and_body(await until_closed(stream))
    assert status == 408
    assert body == {
        "error": "the request body did not arrive within 1 s of its headers (api.body_timeout)"
    }
    await logged(api_log, TOO_SLOW, 1)
    assert_no_traceback(api_log)
    [line] = lines_with(api_log, TOO_SLOW)
    assert line.getMessage().endswith(
        "did not send the body of POST /v1/runs within 1 s: answered 408, nothing was done"
    )


async def test_headers_too_slow_to_arrive_close_the_connection(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with serving(tmp_path, nursery, LIMITS, header_timeout=HEADER_TIMEOUT) as served:
        stream = await served.connect(b"POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert await until_closed(stream) == b""


async def test_an_http2_connection_that_opens_no_stream_is_closed(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with serving(tmp_path, nursery, LIMITS, silence_timeout=SILENCE_TIMEOUT) as served:
        # hypercorn answers the HTTP/2 preface with its settings, then waits for a stream.
        stream = await served.connect(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        answer = await until_closed(stream)
    assert answer, "the server spoke HTTP/2 before closing"


@pytest.mark.parametrize(
    "authorization",
    ["Bearer {token}", "bearer {token}", "BEARER {token}", "bEaReR   {token}"],
)
async def test_the_bearer_scheme_is_case_insensitive(served: Served, authorization: str) -> None:
    header = authorization.format(token=served.token)
    response = await served.client.get("/v1/status", headers={"Authorization": header})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "authorization",
    ["Basic {token}", "Bearer", "Bearer{token}", "{token}", "Bearer {token}x", "Bearer x{token}"],
)
async def test_anything_but_the_bearer_token_is_refused(served: Served, authorization: str) -> None:
    header = authorization.format(token=served.token)
    response = await served.client.get("/v1/status", headers={"Authorization": header})
    assert response.status_code == 401


async def test_many_hostile_connections_at_once_are_all_closed_and_logged_once_each(
    tmp_path: Path, nursery: trio.Nursery, api_log: pytest.LogCaptureFixture
) -> None:
    # Three servers, each with the one short timer that should close its
    # connections (the body's for the requests answered): an HTTP/2
    # preface, say, must be answered before the silence closes its
    # connection, not race a header timeout.
    async with AsyncExitStack() as stack:
        headers_late = await stack.enter_async_context(
            serving(tmp_path / "headers", nursery, LIMITS, header_timeout=HEADER_TIMEOUT)
        )
        silent = await stack.enter_async_context(
            serving(tmp_path / "silence", nursery, LIMITS, silence_timeout=SILENCE_TIMEOUT)
        )
        answered = await stack.enter_async_context(serving(tmp_path / "answered", nursery, LIMITS))
        each = 40
        partial_body = answered.head("POST", "/v1/runs", "Content-Length: 500") + b'{"a'
        no_token = answered.head("POST", "/v1/runs", "Content-Length: 500", auth=False) + b'{"a'
        kinds = {
            "idle": (headers_late, b""),
            "partial headers": (headers_late, b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"),
            "http2 preface": (silent, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            "partial body": (answered, partial_body),
            "partial body, no token": (answered, no_token),
        }
        answers: dict[str, list[bytes]] = {kind: [] for kind in kinds}

        async def hostile(kind: str, stream: trio.SocketStream) -> None:
            answers[kind].append(await until_closed(stream))

        async with trio.open_nursery() as hostiles:
            for kind, (served, data) in kinds.items():
                for _ in range(each):
                    hostiles.start_soon(hostile, kind, await served.connect(data))
            # A well-behaved client is served meanwhile.
            status = await answered.client.get("/v1/status")
            assert status.status_code == 200
    assert answers["idle"] == answers["partial headers"] == [b""] * each
    assert [status_and_body(a)[0] for a in answers["partial body"]] == [408] * each
    assert [status_and_body(a)[0] for a in answers["partial body, no token"]] == [401] * each
    assert all(answers["http2 preface"])
    await logged(api_log, TOO_SLOW, each)
    assert len(lines_with(api_log, TOO_SLOW)) == each
    assert_no_traceback(api_log)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            b'{"provider": "demo", "prompt": "a", "prompt": "b"}',
            "the request body has the key 'prompt' twice in one object; give it once",
        ),
        (
            b'{"provider": "demo", "prompt": "a", "callback_url": "http://h:99999999999999999999/"}',
            "callback_url: the port must be from 1 to 65535, got 99999999999999999999",
        ),
    ],
)
async def test_an_ambiguous_or_unusable_submit_is_refused(
    served: Served, body: bytes, error: str
) -> None:
    response = await served.client.post("/v1/runs", content=body)
    assert response.json() == {"error": error}
    assert response.status_code in (400, 422)
    assert (await served.client.get("/v1/runs")).json() == {"runs": []}


async def test_a_reload_changes_the_limits_for_the_next_request(
    start: Start, tmp_path: Path
) -> None:
    path = write_config(tmp_path, extra=LIMITS)
    running = await start(path)
    body = json.dumps({"provider": "demo", "prompt": "x" * 100_000}).encode()
    assert (await running.client.post("/v1/runs", content=body)).status_code == 201
    path.write_text(path.read_text().replace(f"max_body_bytes = {LIMIT}", "max_body_bytes = 65536"))
    reloaded = (await running.client.post("/v1/reload")).json()
    [change] = [c for c in reloaded["changes"] if c["key"] == "api.max_body_bytes"]
    assert (change["old"], change["new"], change["applied"]) == (str(LIMIT), "65536", True)
    refused = await running.client.post("/v1/runs", content=body)
    assert refused.status_code == 413
    assert "limit of 65536 bytes" in refused.json()["error"]


async def test_bodies_beyond_what_is_read_at_once_wait_their_turn(
    patient: Served, api_log: pytest.LogCaptureFixture
) -> None:
    # Four bodies of the largest size fill what the API reads at once
    # (BODIES_AT_ONCE): each is sent but for its last byte.
    bodies = []
    for n in range(BODIES_AT_ONCE):
        template = json.dumps({"provider": "demo", "id": f"big-{n}", "prompt": "x"})
        bodies.append(template.replace('"x"', '"x' + " " * (LIMIT - len(template)) + '"').encode())
    head = patient.head("POST", "/v1/runs", f"Content-Length: {LIMIT}", "Connection: close")
    big = [await patient.connect(head + body[:-1]) for body in bodies]
    answers: list[int] = []

    async def small() -> None:
        response = await patient.client.post(
            "/v1/runs", json={"provider": "demo", "id": "small", "prompt": "hi"}
        )
        answers.append(response.status_code)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(small)
        await logged(api_log, "waits to send the body of POST /v1/runs", 1)
        assert answers == []
        for stream, body in zip(big, bodies, strict=True):
            await stream.send_all(body[-1:])
        for stream in big:
            status, _ = status_and_body(await until_closed(stream))
            assert status == 201
    assert answers == [201]
    listed = (await patient.client.get("/v1/runs")).json()["runs"]
    assert sorted(r["id"] for r in listed) == ["big-0", "big-1", "big-2", "big-3", "small"]
    assert_no_traceback(api_log)


async def test_a_body_that_finds_no_room_in_its_time_is_answered_503(
    start: Start, tmp_path: Path, api_log: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path, extra=LIMITS.replace('"1s"', '"30s"'))
    running = await start(path)
    url = httpx.URL(str(running.client.base_url))
    assert url.port is not None
    token = token_path(running.config).read_text().strip()
    served = Served(running.supervisor, running.client, url.port, token)
    head = served.head("POST", "/v1/runs", f"Content-Length: {LIMIT}", "Connection: close")
    # Bodies that have 30 s to arrive fill the room: one more waits (its line
    # says they all hold their room)...
    holders = [await served.connect(head + b"{") for _ in range(BODIES_AT_ONCE + 1)]
    await logged(api_log, "waits to send the body of POST /v1/runs", 1)
    # ...so a body with 1 s to arrive cannot get any.
    path.write_text(path.read_text().replace('"30s"', '"1s"'))
    assert (await running.client.post("/v1/reload")).status_code == 200
    refused = await running.client.post("/v1/runs", json={"provider": "demo", "prompt": "hi"})
    assert refused.status_code == 503
    assert refused.json() == {
        "error": f"other request bodies fill the {BODIES_AT_ONCE * LIMIT} bytes the API reads"
        f" at once ({BODIES_AT_ONCE} times api.max_body_bytes) and left no room for this one"
        " within 1 s (api.body_timeout): nothing was done; ask again"
    }
    [line] = lines_with(api_log, "found no room for the body of POST /v1/runs")
    assert line.getMessage().endswith("within 1 s: answered 503, nothing was done")
    for stream in holders:
        await stream.aclose()
    await logged(api_log, HUNG_UP, BODIES_AT_ONCE + 1)
    assert (await running.client.get("/v1/runs")).json() == {"runs": []}
    assert_no_traceback(api_log)


@pytest.mark.parametrize(
    "raw_id", ["%00", "%ff%fe", "x%0Ay", "%F0%9F%98%80", "a" * 5000, "..", "%2e%2e"]
)
async def test_a_hostile_run_id_in_the_path_is_an_unknown_run(served: Served, raw_id: str) -> None:
    for method, path in (("GET", f"/v1/runs/{raw_id}"), ("POST", f"/v1/runs/{raw_id}/cancel")):
        response = await served.client.request(method, path)
        assert response.status_code == 404, response.text
        assert "error" in response.json()
