"""The JSON HTTP API (Starlette, served by hypercorn's trio worker).

Every request must carry ``Authorization: Bearer <token>``. Errors are JSON
``{"error": message}``: 400 malformed, 401 token, 404 unknown run, 408 body
too slow and 413 body too large (:mod:`~herdsman.runtime.api.limits`), 409
conflicting state, 422 invalid field, 503 shutting down, or a run ledger that
failed (locked, full, unreachable, closed while stopping). A submit's 503 also
lists the run ids in ``"ids"``: submitting them again is safe.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import outcome
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse as StarletteJSONResponse
from starlette.responses import Response
from starlette.routing import Route

from herdsman.runtime.api.ledger_answers import not_recorded, unavailable
from herdsman.runtime.api.limits import BodyLimits, client_hung_up
from herdsman.runtime.intake import InvalidRequest, load_json, parse_batch, parse_submit
from herdsman.runtime.ledger import LedgerBroken, LedgerClosed
from herdsman.runtime.store import RunStatus, StoreConflict, StoreError
from herdsman.runtime.store.errors import RunNotFound as UnknownRun
from herdsman.runtime.supervisor import (
    CancelNotRecorded,
    NotAdmitting,
    RunConflict,
    RunNotFound,
    Supervisor,
    UnknownAccount,
)
from herdsman.runtime.views import run_view

Handler = Callable[[Request], Awaitable[Response]]
log = logging.getLogger("herdsman.api")

MAX_WAIT = 300.0
MAX_LIST = 1000
#: How long a cancel of a running run waits for it to be recorded ended
#: (the runner's kill grace is 5 s; a fleet member's holder sees it within a poll).
CANCEL_WAIT = 10.0

#: Store errors that are bugs, not an unavailable ledger: the ledger works and
#: refused something nothing mapped to a 4xx, or the ledger met a bug. They go
#: on to the 500 handler; every other StoreError is a 503.
_BUGS = (StoreConflict, UnknownRun, LedgerBroken)


# Starlette's JSONResponse calls json.dumps with options, which builds an
# encoder per response; this one is shared and writes the same bytes.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class JSONResponse(StarletteJSONResponse):
    """Starlette's JSON response, rendered by one shared encoder."""

    def render(self, content: Any) -> bytes:
        """``content`` as compact UTF-8 JSON (no NaN), exactly as Starlette renders it."""
        return _ENCODER.encode(content).encode("utf-8")


def error(status: int, message: str) -> JSONResponse:
    """A JSON error response."""
    return JSONResponse({"error": message}, status_code=status)


async def read_json(request: Request) -> Any:
    """The request body as JSON, or a 400."""
    return load_json(await request.body())


def number_param(request: Request, name: str, default: float, maximum: float) -> float:
    """A numeric query parameter within ``[0, maximum]``, or a 422."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(422, f"{name}: must be a number, got {raw!r}") from None
    if not 0 <= value <= maximum:
        raise InvalidRequest(422, f"{name}: must be from 0 to {maximum:g}, got {raw}")
    return value


def bearer_token(authorization: str) -> bytes:
    """The credentials of an ``Authorization: Bearer ...`` header, else ``b""``.

    The scheme is case-insensitive and may be followed by several spaces (RFC 7235).
    """
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return b""
    return credentials.lstrip(" ").encode()


class Api:
    """The endpoint handlers of one supervisor."""

    def __init__(self, supervisor: Supervisor, token: str) -> None:
        self.supervisor = supervisor
        self._token = token.encode()

    def guarded(self, handler: Handler) -> Handler:
        """Check the bearer token, and turn intake errors into JSON answers."""

        async def wrapper(request: Request) -> Response:
            given = bearer_token(request.headers.get("authorization", ""))
            if not secrets.compare_digest(given, self._token):
                return error(401, "missing or wrong bearer token (see the token file in state_dir)")
            try:
                return await handler(request)
            except InvalidRequest as exc:
                return error(exc.status, exc.message)
            except RunNotFound as exc:
                return error(404, f"no run with id {exc.args[0]!r}")
            except RunConflict as exc:
                return error(409, str(exc))
            except UnknownAccount as exc:
                return error(404, str(exc))
            except (NotAdmitting, CancelNotRecorded, LedgerClosed) as exc:
                # A closed ledger, as a stopping supervisor's: not a passing
                # failure, so no "ask again" (the next request meets it too).
                return error(503, str(exc))
            except _BUGS:
                raise
            except StoreError as exc:
                return error(503, unavailable(exc))

        return wrapper

    async def submit(self, request: Request) -> Response:
        """``POST /v1/runs``: 201 for a new run, 200 with the existing one for a known id."""
        providers = self.supervisor.config.providers
        new, on_busy = parse_submit(await read_json(request), providers)
        try:
            record, created = await self.supervisor.submit(new, on_busy)
        except _BUGS:
            raise
        except StoreError as exc:
            return JSONResponse(not_recorded([new.id], exc, batch=False), status_code=503)
        return JSONResponse(run_view(record), status_code=201 if created else 200)

    async def submit_batch(self, request: Request) -> Response:
        """``POST /v1/runs/batch``: several runs, queued in the order given."""
        items = parse_batch(await read_json(request), self.supervisor.config.providers)
        try:
            results = await self.supervisor.submit_each(items)
        except _BUGS:
            raise
        except StoreError as exc:
            # The commit failed as a whole.
            body = not_recorded([new.id for new, _ in items], exc, batch=True)
            return JSONResponse(body, status_code=503)
        answers: list[dict[str, object]] = []
        for (new, _), result in zip(items, results, strict=True):
            if isinstance(result, outcome.Value):
                record, created = result.value
                answers.append({"created": created, "run": run_view(record)})
                continue
            assert isinstance(result, outcome.Error)
            refusal = result.error
            if isinstance(refusal, _BUGS) or not isinstance(refusal, StoreError):
                raise refusal
            # The ledger refused this run alone: the others were recorded.
            refused = not_recorded([new.id], refusal, batch=False)
            answers.append({"id": new.id, "error": refused["error"]})
        return JSONResponse({"results": answers})

    async def get_run(self, request: Request) -> Response:
        """``GET /v1/runs/{id}[?wait=SECONDS]``."""
        run_id = request.path_params["run_id"]
        wait = number_param(request, "wait", 0.0, MAX_WAIT)
        if wait > 0:
            record = await self.supervisor.wait(run_id, wait)
            try:
                attempts = await self.supervisor.attempts(run_id)
            except StoreError:
                # A long poll answered as the supervisor stops, its ledger
                # closing: the run as it ended, without its earlier attempts
                # (the field is left out, not shown empty).
                return JSONResponse(run_view(record))
            return JSONResponse(run_view(record, attempts))
        found = await self.supervisor.get(run_id)
        if found is None:
            raise RunNotFound(run_id)
        return JSONResponse(run_view(found, await self.supervisor.attempts(run_id)))

    async def list_runs(self, request: Request) -> Response:
        """``GET /v1/runs`` with filters, newest first."""
        params = request.query_params
        unknown = sorted(set(params) - {"status", "provider", "conversation", "workspace", "limit"})
        if unknown:
            raise InvalidRequest(422, f"{unknown[0]}: unknown filter")
        status = params.get("status")
        if status is not None and status not in {s.value for s in RunStatus}:
            choices = ", ".join(s.value for s in RunStatus)
            raise InvalidRequest(422, f"status: must be one of {choices}, got {status!r}")
        limit = int(number_param(request, "limit", 100, MAX_LIST))
        runs = await self.supervisor.list_runs(
            status=RunStatus(status) if status else None,
            provider=params.get("provider"),
            conversation=params.get("conversation"),
            workspace=params.get("workspace"),
            limit=limit,
        )
        return JSONResponse({"runs": [run_view(r) for r in runs]})

    async def cancel(self, request: Request) -> Response:
        """``POST /v1/runs/{id}/cancel``: 200 once ended, 202 if still being stopped."""
        run_id = request.path_params["run_id"]
        record = await self.supervisor.cancel(run_id)
        if not record.is_terminal:
            # A running run: its process group is being stopped (here, or by
            # the fleet member holding it); give the runner its kill grace to
            # record the outcome before answering.
            record = await self.supervisor.wait(run_id, CANCEL_WAIT)
        return JSONResponse(run_view(record), status_code=200 if record.is_terminal else 202)

    async def worktrees(self, request: Request) -> Response:
        """``GET /v1/worktrees``: every conversation's checkouts and their state."""
        return JSONResponse({"worktrees": await self.supervisor.list_worktrees()})

    async def sweep(self, request: Request) -> Response:
        """``POST /v1/worktrees/sweep`` ``{"dry_run": bool}``: sweep now, say what happened."""
        raw = await request.body()
        body = load_json(raw) if raw.strip() else {}
        if not isinstance(body, dict) or set(body) - {"dry_run"}:
            raise InvalidRequest(422, 'the body may only hold "dry_run"')
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise InvalidRequest(422, "dry_run: must be true or false")
        report = await self.supervisor.sweep_worktrees(dry_run=dry_run)
        entries = [
            {
                "workspace": e.workspace,
                "conversation": e.conversation,
                "repo": e.repo,
                "path": str(e.path),
                "action": e.action,
                "detail": e.detail,
            }
            for e in report.entries
        ]
        return JSONResponse({"dry_run": dry_run, "entries": entries})

    async def status(self, request: Request) -> Response:
        """``GET /v1/status``; a fleet member's also has ``fleet``, read from the ledger."""
        body = self.supervisor.status()
        fleet = await self.supervisor.fleet_status()
        if fleet is not None:
            body["fleet"] = fleet
        return JSONResponse(body)

    async def accounts(self, request: Request) -> Response:
        """``GET /v1/accounts``: every account, and providers waiting for one."""
        return JSONResponse(
            {
                "accounts": self.supervisor.accounts(),
                "waiting": self.supervisor.waiting_for_accounts(),
            }
        )

    async def end_rest(self, request: Request) -> Response:
        """``POST /v1/accounts/end-rest``: the account is available again now.

        The body is ``{"provider": ..., "account": ...}``; ``account`` absent
        or null means the provider's ambient environment.
        """
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidRequest(400, "the request body must be a JSON object")
        unknown = sorted(set(body) - {"provider", "account"})
        if unknown:
            raise InvalidRequest(422, f"{unknown[0]}: unknown field; expected provider, account")
        provider, account = body.get("provider"), body.get("account")
        if not isinstance(provider, str):
            raise InvalidRequest(422, f"provider: required, a string; got {provider!r}")
        if account is not None and not isinstance(account, str):
            raise InvalidRequest(422, f"account: a string or null; got {account!r}")
        return JSONResponse(await self.supervisor.end_rest(provider, account))

    async def reload(self, request: Request) -> Response:
        """``POST /v1/reload``: read the file again; 200 applied or unchanged, 422 rejected."""
        result = await self.supervisor.reload("API")
        body = result.as_json()
        if not result.ok:
            body["error"] = "reload rejected; nothing changed: " + "; ".join(result.errors)
        return JSONResponse(body, status_code=200 if result.ok else 422)

    async def metrics(self, request: Request) -> Response:
        """``GET /metrics`` in the Prometheus text format."""
        body = self.supervisor.metrics.render()
        return Response(body, media_type="text/plain; version=0.0.4")


async def unexpected_error(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered as JSON (a failing ledger is a 503)."""
    log.error("error answering %s %s", request.method, request.url.path, exc_info=exc)
    return error(500, f"internal error: {type(exc).__name__}: {exc}")


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (unknown path, wrong method) as JSON too."""
    assert isinstance(exc, HTTPException)
    return error(exc.status_code, exc.detail)


def create_app(supervisor: Supervisor, token: str) -> Starlette:
    """The API application bound to one supervisor and its bearer token."""
    api = Api(supervisor, token)
    guarded = api.guarded
    routes = [
        Route("/v1/runs", guarded(api.submit), methods=["POST"]),
        Route("/v1/runs", guarded(api.list_runs), methods=["GET"]),
        Route("/v1/runs/batch", guarded(api.submit_batch), methods=["POST"]),
        Route("/v1/runs/{run_id}", guarded(api.get_run), methods=["GET"]),
        Route("/v1/runs/{run_id}/cancel", guarded(api.cancel), methods=["POST"]),
        Route("/v1/status", guarded(api.status), methods=["GET"]),
        Route("/v1/accounts", guarded(api.accounts), methods=["GET"]),
        Route("/v1/accounts/end-rest", guarded(api.end_rest), methods=["POST"]),
        Route("/v1/worktrees", guarded(api.worktrees), methods=["GET"]),
        Route("/v1/worktrees/sweep", guarded(api.sweep), methods=["POST"]),
        Route("/v1/reload", guarded(api.reload), methods=["POST"]),
        Route("/metrics", guarded(api.metrics), methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(BodyLimits, settings=lambda: supervisor.config.api)],
        exception_handlers={
            HTTPException: http_error,
            ClientDisconnect: client_hung_up,
            Exception: unexpected_error,
        },
    )
