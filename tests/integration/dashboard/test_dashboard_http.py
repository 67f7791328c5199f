"""The dashboard's routes through a real HTTP server: login, the cookie, actions, the stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from dashboard_support import Served, open_gate

import herdsman.runtime.dashboard.app as dashboard_app

#: Every route that reads or acts, with its method.
GUARDED = [
    ("GET", "/dashboard/state"),
    ("GET", "/dashboard/events"),
    ("GET", "/dashboard/timeline"),
    ("GET", "/dashboard/worktrees"),
    ("GET", "/dashboard/runs/r1"),
    ("GET", "/dashboard/runs/r1/log"),
    ("POST", "/dashboard/runs/r1/cancel"),
    ("POST", "/dashboard/reload"),
    ("POST", "/dashboard/accounts/end-rest"),
    ("POST", "/logout"),
]


async def submit(served: Served, prompt: str, conversation: str = "c1") -> str:
    answer = await served.api.post(
        "/v1/runs", json={"provider": "gate", "prompt": prompt, "conversation": conversation}
    )
    assert answer.status_code == 201, answer.text
    run_id: str = answer.json()["id"]
    return run_id


async def page_csrf(client: httpx.AsyncClient) -> str:
    """The anti-forgery value the logged-in page carries (a browser's page script reads it)."""
    page = (await client.get("/")).text
    return page.split('name="herdsman-csrf" content="')[1].split('"')[0]


async def state(client: httpx.AsyncClient) -> dict[str, Any]:
    answer = await client.get("/dashboard/state")
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_without_the_cookie_every_route_answers_401_and_nothing_else(
    served: Served,
) -> None:
    run_id = await submit(served, "a")
    async with served.browser() as browser:
        for method, path in GUARDED:
            # Even the API's own bearer token is no cookie.
            for headers in ({}, {"Authorization": f"Bearer {served.token}"}):
                answer = await browser.request(method, path, headers=headers)
                assert answer.status_code == 401, (method, path)
                assert answer.json() == {"error": "log in first"}
        page = await browser.get("/")
    # The login form alone: no run, no state.
    assert page.status_code == 200
    assert 'name="token"' in page.text
    assert run_id not in page.text
    assert "gate" not in page.text


async def test_logging_in_sets_a_strict_http_only_cookie_and_never_puts_the_token_in_a_url(
    served: Served,
) -> None:
    async with served.browser() as browser:
        wrong = await browser.post("/login", data={"token": "not-it"})
        assert wrong.status_code == 401
        assert "That is not the API token." in wrong.text
        assert "set-cookie" not in wrong.headers
        right = await browser.post("/login", data={"token": served.token})
        assert right.status_code == 303
        assert right.headers["location"] == "/"
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "Path=/" in cookie
        assert served.token not in cookie
        page = await browser.get("/")
        assert 'id="view-overview"' in page.text
        assert served.token not in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert (await state(browser))["state"]["providers"] == {"gate": {"concurrency": 1}}


async def test_a_login_posted_from_another_site_is_refused(served: Served) -> None:
    async with served.browser() as browser:
        answer = await browser.post(
            "/login", data={"token": served.token}, headers={"Origin": "http://evil.example"}
        )
    assert answer.status_code == 403
    assert "set-cookie" not in answer.headers


async def test_an_action_needs_the_pages_header_and_the_same_origin(served: Served) -> None:
    await submit(served, "a")
    queued = await submit(served, "b")
    async with served.logged_in() as client:
        csrf = await page_csrf(client)
        cancel = f"/dashboard/runs/{queued}/cancel"
        forged = [
            {},
            {"x-herdsman-csrf": "wrong"},
            {"x-herdsman-csrf": csrf, "Origin": "http://evil.example"},
        ]
        for headers in forged:
            answer = await client.post(cancel, headers=headers)
            assert answer.status_code == 403, headers
        run = await served.api.get(f"/v1/runs/{queued}")
        assert run.json()["status"] == "queued"
        origin = served.url
        answer = await client.post(cancel, headers={"x-herdsman-csrf": csrf, "Origin": origin})
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "cancelled"
        # The API's own answers: an unknown run is its 404.
        missing = await client.post(
            "/dashboard/runs/nosuch/cancel", headers={"x-herdsman-csrf": csrf}
        )
        assert missing.status_code == 404
        assert missing.json() == {"error": "no run with id 'nosuch'"}


class Events:
    """An event stream read over a plain socket (HTTP/1.0: no chunked framing to undo)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = b""
        self.head = b""

    async def _event(self) -> bytes:
        while True:
            event, separator, rest = self._buffer.partition(
                b"\r\n\r\n" if not self.head else b"\n\n"
            )
            if separator:
                self._buffer = rest
                return event
            chunk = await self._stream.receive_some()
            assert chunk, "the stream ended"
            self._buffer += chunk

    async def until_renewed(self) -> None:
        """Read on until the stream says to open a new one (it must not end before)."""
        while b"event: renew\ndata: {}\n\n" not in self._buffer:
            chunk = await self._stream.receive_some()
            assert chunk, "the stream ended without saying to open a new one"
            self._buffer += chunk

    async def next_snapshot(self) -> dict[str, Any]:
        """The next ``state`` event's snapshot."""
        if not self.head:
            self.head = await self._event()
        while True:
            for line in (await self._event()).split(b"\n"):
                if line.startswith(b"data: "):
                    snapshot: dict[str, Any] = json.loads(line.removeprefix(b"data: "))
                    return snapshot


@asynccontextmanager
async def events(served: Served, client: httpx.AsyncClient) -> AsyncIterator[Events]:
    """The dashboard's event stream, opened with ``client``'s cookie."""
    address = httpx.URL(served.url)
    assert address.port is not None
    stream = await trio.open_tcp_stream(address.host, address.port)
    async with stream:
        cookie = f"herdsman_session={client.cookies.get('herdsman_session', '')}"
        request = f"GET /dashboard/events HTTP/1.0\r\nHost: {address.netloc.decode()}\r\n"
        await stream.send_all(f"{request}Cookie: {cookie}\r\n\r\n".encode())
        yield Events(stream)


async def test_the_stream_sends_a_snapshot_then_one_after_each_change(served: Served) -> None:
    async with served.logged_in() as client, events(served, client) as stream:
        first = await stream.next_snapshot()
        assert b"content-type: text/event-stream" in stream.head
        assert first["state"]["running"] == []
        run_id = await submit(served, "a")
        seen: list[str] = []
        with trio.fail_after(20):
            while "running" not in seen:
                snapshot = await stream.next_snapshot()
                seen += [r["status"] for r in snapshot["state"]["running"] if r["id"] == run_id]
            open_gate(served.directory, "a")
            while True:
                snapshot = await stream.next_snapshot()
                recent = {r["id"]: r["status"] for r in snapshot["state"]["recent"]}
                if recent[run_id] == "succeeded":
                    break
        assert snapshot["number"] > first["number"]


async def test_many_open_streams_leave_room_for_other_requests(served: Served) -> None:
    """A stream holds none of the room the API keeps for request bodies."""
    async with served.logged_in() as client, trio.open_nursery() as nursery:
        opened = trio.Semaphore(0)

        async def follow() -> None:
            async with events(served, client) as stream:
                await stream.next_snapshot()
                opened.release()
                await trio.sleep_forever()

        for _ in range(8):
            nursery.start_soon(follow)
        for _ in range(8):
            await opened.acquire()
        with trio.fail_after(10):
            await submit(served, "a")
        nursery.cancel_scope.cancel()


async def test_a_log_is_read_rendered_and_followed(served: Served) -> None:
    run_id = await submit(served, "a")
    async with served.logged_in() as client:
        with trio.fail_after(20):
            while True:
                piece = (await client.get(f"/dashboard/runs/{run_id}/log")).json()
                if piece["text"]:
                    break
                await trio.sleep(0.05)
        assert piece == {
            "text": "working on a\n",
            "offset": len("working on a\n"),
            "missing": False,
            "more": False,
            "status": "running",
        }
        open_gate(served.directory, "a")
        await served.api.get(f"/v1/runs/{run_id}", params={"wait": 20})
        rest = (await client.get(f"/dashboard/runs/{run_id}/log", params={"offset": 13})).json()
        assert rest["text"] == "finished a\n"
        assert rest["status"] == "succeeded"
        bad = await client.get("/dashboard/runs/../log")
        assert bad.status_code in (404, 422)


@pytest.mark.parametrize("hours", ["-1", "49", "x"])
async def test_a_timeline_window_out_of_range_is_refused(served: Served, hours: str) -> None:
    async with served.logged_in() as client:
        answer = await client.get("/dashboard/timeline", params={"hours": hours})
    assert answer.status_code == 422
    assert answer.json()["error"].startswith("hours: must be")


async def test_a_stream_ends_cleanly_when_the_supervisor_stops(served: Served) -> None:
    """The page is told to come back later, rather than the server dropping it."""
    async with served.logged_in() as client, events(served, client) as stream:
        await stream.next_snapshot()
        served.serving.supervisor.request_shutdown()
        await stream.until_renewed()


async def test_worktrees_are_listed_clean_or_dirty(
    served_with_repo: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_with_repo
    run_id = await submit(served, "w", conversation="feature")
    open_gate(served.directory, "w")
    done = await served.api.get(f"/v1/runs/{run_id}", params={"wait": 20})
    assert done.json()["status"] == "succeeded"
    async with served.logged_in() as client:
        [tree] = (await client.get("/dashboard/worktrees")).json()["worktrees"]
        assert (tree["conversation"], tree["repo"], tree["status"]) == ("feature", "app", "clean")
        (Path(tree["path"]) / "notes.txt").write_text("draft\n")
        # Read again at most every few seconds, whatever the number of pages.
        [cached] = (await client.get("/dashboard/worktrees")).json()["worktrees"]
        assert cached["status"] == "clean"
        monkeypatch.setattr(dashboard_app, "WORKTREES_FRESH", 0.0)  # as if the time had passed
        [tree] = (await client.get("/dashboard/worktrees")).json()["worktrees"]
        assert (tree["status"], tree["changed"]) == ("dirty", ["notes.txt"])


async def test_ending_a_rest_from_the_page_answers_as_the_api(served: Served) -> None:
    async with served.logged_in() as client:
        csrf = await page_csrf(client)
        headers = {"x-herdsman-csrf": csrf}
        ended = await client.post(
            "/dashboard/accounts/end-rest",
            json={"provider": "gate", "account": None},
            headers=headers,
        )
        assert ended.status_code == 200, ended.text
        assert (ended.json()["provider"], ended.json()["available"]) == ("gate", True)
        unknown = await client.post(
            "/dashboard/accounts/end-rest",
            json={"provider": "gate", "account": "x"},
            headers=headers,
        )
        assert unknown.status_code == 404
        assert unknown.json() == {
            "error": "provider 'gate' has no account 'x': its only account is the ambient one"
            " (leave the account out: `accounts end-rest gate`)"
        }
