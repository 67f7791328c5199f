"""The dashboard's routes, served beside the API on its address.

``/`` is the page (or, without the session cookie, the login form); the
page reads ``/dashboard/state`` once, then follows ``/dashboard/events``, a
server-sent event stream with a snapshot of the state after each change
(:mod:`~herdsman.runtime.dashboard.snapshot`). Every route but the login
form and the static files answers 401, with nothing in it, to a request
without the session cookie; actions (cancel, reload, end a rest) also need
the page's anti-forgery header and a same-site ``Origin``. Cancel and end a
rest are the API's own handlers, so they answer exactly as the API does.
"""

from __future__ import annotations

import html
import math
import time
from typing import Any
from urllib.parse import parse_qs

import trio
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import Receive, Scope, Send

from herdsman.runtime.api.app import Api, Handler, JSONResponse, error, number_param
from herdsman.runtime.dashboard.assets import STATIC
from herdsman.runtime.dashboard.auth import COOKIE_MAX_AGE, Keys, cookie_header, same_origin
from herdsman.runtime.dashboard.logs import read_piece
from herdsman.runtime.dashboard.snapshot import Snapshots, brief_run, read_state
from herdsman.runtime.ids import run_id_problem
from herdsman.runtime.intake import InvalidRequest
from herdsman.runtime.supervisor import RunNotFound, Supervisor
from herdsman.runtime.views import run_view

#: The event stream's path (served outside the API's body limits: see ``with_dashboard``).
EVENTS = "/dashboard/events"
#: A comment line this often keeps proxies and the browser from closing a quiet stream.
KEEPALIVE = 25.0
#: A stream ends after this long, saying so, and the page opens a new one: no
#: connection lives long enough to meet the server's silence timeout.
STREAM_LIFE = 240.0
#: Runs the timeline reads at most.
TIMELINE_RUNS = 1000
#: The longest window the timeline shows, in hours.
TIMELINE_HOURS = 48.0
#: How long a listing of worktrees is shown before it is read again (git is slow).
WORKTREES_FRESH = 15.0

_STATIC_TYPES = {
    "app.js": "text/javascript; charset=utf-8",
    "timeline.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

#: Scripts and styles only from this server, no frames, forms only to it.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    # "no-referrer" would make the browser send "Origin: null" with the login form.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


def _page(name: str, **values: str) -> str:
    """A static HTML page with ``{{name}}`` placeholders filled (values HTML-escaped)."""
    text = (STATIC / name).read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", html.escape(value))
    return text


def _secured(response: Response) -> Response:
    response.headers.update(SECURITY_HEADERS)
    return response


def _nothing() -> Response:
    """The answer to a request without the session cookie: a 401 that says only that."""
    return _secured(error(401, "log in first"))


class Dashboard:
    """The dashboard of one supervisor, logged into with its API token."""

    def __init__(self, supervisor: Supervisor, token: str) -> None:
        self.supervisor = supervisor
        self.keys = Keys(token)
        self._bearer = f"Bearer {token}".encode()
        self._api = Api(supervisor, token)
        self.snapshots = Snapshots(supervisor.changes, lambda: read_state(supervisor), time.time)
        self._worktrees: tuple[float, Any] | None = None
        self._worktrees_lock = trio.Lock()

    def routes(self) -> list[Route]:
        """The routes besides the event stream."""
        api = self._api
        return [
            Route("/", self.index, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", self.action(self.logout), methods=["POST"]),
            Route("/dashboard/static/{name}", self.static, methods=["GET"]),
            Route("/dashboard/state", self.reader(self.state), methods=["GET"]),
            Route("/dashboard/timeline", self.reader(self.timeline), methods=["GET"]),
            Route("/dashboard/worktrees", self.reader(self.worktrees), methods=["GET"]),
            Route("/dashboard/runs/{run_id}", self.reader(self.run), methods=["GET"]),
            Route("/dashboard/runs/{run_id}/log", self.reader(self.log), methods=["GET"]),
            Route(
                "/dashboard/runs/{run_id}/cancel",
                self.action(self.as_api(api.cancel)),
                methods=["POST"],
            ),
            Route("/dashboard/reload", self.action(self.reload), methods=["POST"]),
            Route(
                "/dashboard/accounts/end-rest",
                self.action(self.as_api(api.end_rest)),
                methods=["POST"],
            ),
        ]

    # -- guards ------------------------------------------------------------

    def reader(self, handler: Handler) -> Handler:
        """Answer only a request with the session cookie; errors as the API answers them."""
        answered = self.as_api(handler)

        async def read(request: Request) -> Response:
            if not self.keys.logged_in(request):
                return _nothing()
            return _secured(await answered(request))

        return read

    def action(self, handler: Handler) -> Handler:
        """Act only on a same-site request with the cookie and the page's anti-forgery header."""

        async def act(request: Request) -> Response:
            if not self.keys.logged_in(request):
                return _nothing()
            if not (same_origin(request) and self.keys.csrf_matches(request)):
                return _secured(
                    error(403, "refused: not sent by this dashboard's page (reload the page)")
                )
            return _secured(await handler(request))

        return act

    def as_api(self, handler: Handler) -> Handler:
        """``handler`` behind the API's guard: its errors (a bad field, an unknown run, a
        failing ledger) answered as the API answers them; called with the bearer token."""
        guarded = self._api.guarded(handler)

        async def call(request: Request) -> Response:
            scope = dict(request.scope)
            headers = MutableHeaders(scope=scope)
            headers["authorization"] = self._bearer.decode()
            return await guarded(Request(scope, request.receive))

        return call

    # -- pages ---------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        """The dashboard, or the login form without the cookie."""
        if not self.keys.logged_in(request):
            return self._login_form("", 200)
        return _secured(HTMLResponse(_page("index.html", csrf=self.keys.csrf)))

    def _login_form(self, problem: str, status: int) -> Response:
        token_file = str(self.supervisor.config.api.token_file)
        page = _page("login.html", problem=problem, token_file=token_file)
        return _secured(HTMLResponse(page, status_code=status))

    async def login(self, request: Request) -> Response:
        """``POST /login`` with the form's ``token``: set the cookie, back to ``/``."""
        if not same_origin(request):
            return self._login_form("This login did not come from this dashboard's page.", 403)
        # The form is one field: parsed here rather than with a multipart library.
        form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
        token = form.get("token", [""])[0]
        if not self.keys.token_matches(token):
            return self._login_form("That is not the API token.", 401)
        response = RedirectResponse("/", status_code=303)
        response.headers.append("set-cookie", cookie_header(self.keys.session, COOKIE_MAX_AGE))
        return _secured(response)

    async def logout(self, request: Request) -> Response:
        """``POST /logout``: the cookie is removed."""
        response = JSONResponse({"ok": True})
        response.headers.append("set-cookie", cookie_header("", 0))
        return response

    async def static(self, request: Request) -> Response:
        """The page's script and style sheet (the same for everyone: no state in them)."""
        name = request.path_params["name"]
        media_type = _STATIC_TYPES.get(name)
        if media_type is None:
            return _secured(error(404, f"no file {name!r}"))
        body = (STATIC / name).read_bytes()
        return _secured(Response(body, media_type=media_type))

    async def reload(self, request: Request) -> Response:
        """``POST /dashboard/reload``: the reload's result, 200 even if rejected.

        A rejection is an answer the page shows (the API says 422): the
        browser would log any 4xx as a failed request.
        """
        result = await self.supervisor.reload("dashboard")
        return JSONResponse(result.as_json())

    # -- reads ---------------------------------------------------------------

    async def state(self, request: Request) -> Response:
        """``GET /dashboard/state``: the latest snapshot."""
        _, payload = await self.snapshots.current()
        return Response(payload, media_type="application/json")

    async def timeline(self, request: Request) -> Response:
        """``GET /dashboard/timeline?hours=H``: runs that ran or waited in the last hours."""
        hours = number_param(request, "hours", 6.0, TIMELINE_HOURS)
        since = time.time() - hours * 3600
        runs = await self.supervisor.list_runs(limit=TIMELINE_RUNS)
        shown = [
            brief_run(r)
            for r in runs
            if r.finished_at is None or r.finished_at >= since or r.submitted_at >= since
        ]
        return JSONResponse({"since": since, "runs": shown})

    async def worktrees(self, request: Request) -> Response:
        """``GET /dashboard/worktrees``: every checkout, read again at most every few seconds."""
        async with self._worktrees_lock:
            now = trio.current_time()
            if self._worktrees is None or now - self._worktrees[0] > WORKTREES_FRESH:
                self._worktrees = (now, await self.supervisor.list_worktrees())
            listing = self._worktrees[1]
        return JSONResponse({"worktrees": listing})

    def _run_id(self, request: Request) -> str:
        run_id: str = request.path_params["run_id"]
        if problem := run_id_problem(run_id):
            raise InvalidRequest(422, f"run id {problem}")
        return run_id

    async def run(self, request: Request) -> Response:
        """``GET /dashboard/runs/{id}``: the whole run, as the API gives it."""
        run_id = self._run_id(request)
        record = await self.supervisor.get(run_id)
        if record is None:
            raise RunNotFound(run_id)
        return JSONResponse(run_view(record))

    async def log(self, request: Request) -> Response:
        """``GET /dashboard/runs/{id}/log?offset=N``: the next piece of the run's log."""
        run_id = self._run_id(request)
        offset = int(number_param(request, "offset", 0, math.inf))
        record = await self.supervisor.get(run_id)
        if record is None:
            raise RunNotFound(run_id)
        state_dir = self.supervisor.config.supervisor.state_dir
        piece = await trio.to_thread.run_sync(
            lambda: read_piece(state_dir, run_id, offset, ended=record.is_terminal)
        )
        piece["status"] = record.status.value
        return JSONResponse(piece)

    # -- the event stream ---------------------------------------------------------

    async def events(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``GET /dashboard/events``: a snapshot now, then one after each change."""
        connection = HTTPConnection(scope)
        if scope["method"] != "GET" or not self.keys.logged_in(connection):
            response = _nothing() if scope["method"] == "GET" else error(405, "use GET")
            await response(scope, receive, send)
            return
        headers = {
            **SECURITY_HEADERS,
            "content-type": "text/event-stream; charset=utf-8",
            "x-accel-buffering": "no",
        }
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            }
        )
        async with trio.open_nursery() as nursery:

            async def until_hung_up() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_hung_up)
            await self._stream(send)
            nursery.cancel_scope.cancel()

    async def _stream(self, send: Send) -> None:
        async def chunk(text: bytes) -> None:
            await send({"type": "http.response.body", "body": text, "more_body": True})

        async def follow() -> None:
            number, payload = await self.snapshots.current()
            await chunk(b"retry: 2000\nevent: state\ndata: " + payload + b"\n\n")
            while True:
                with trio.move_on_after(KEEPALIVE):
                    number, payload = await self.snapshots.after(number)
                    await chunk(b"event: state\ndata: " + payload + b"\n\n")
                    continue
                await chunk(b": keepalive\n\n")

        async def until_stopped(scope: trio.CancelScope) -> None:
            # The server waits for open answers when it stops: end this one first.
            await self.supervisor.finished.wait()
            scope.cancel()

        with trio.move_on_after(STREAM_LIFE) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(until_stopped, scope)
                await follow()
        # The page opens a new stream at once (or, the supervisor gone, once it is back).
        await chunk(b"event: renew\ndata: {}\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Events:
    """The event stream as a plain ASGI app (Starlette calls a function a handler)."""

    def __init__(self, dashboard: Dashboard) -> None:
        self._dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._dashboard.events(scope, receive, send)


def with_dashboard(api: Starlette, supervisor: Supervisor, token: str) -> Starlette:
    """The API app ``api`` with the dashboard beside it.

    The dashboard's routes join the API's, so its requests have the same body
    limits and JSON errors. The event stream alone is served in front of
    them: the body limits hold room for a request's body until it is
    answered, and a stream is answered only when the page closes.
    """
    dashboard = Dashboard(supervisor, token)
    api.router.routes.extend(dashboard.routes())
    return Starlette(routes=[Route(EVENTS, _Events(dashboard)), Mount("", app=api)])
