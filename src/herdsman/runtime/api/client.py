"""A small synchronous client of the API, for the CLI."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from herdsman.config import Config


class ApiUnavailable(Exception):
    """No supervisor answered at the configured address."""


class ApiError(Exception):
    """The API answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def base_url(listen: str) -> str:
    """The URL of an API listening on ``HOST:PORT``."""
    host, _, port = listen.rpartition(":")
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "[::]":
        host = "[::1]"
    return f"http://{host}:{port}"


class ApiClient:
    """Talks to one supervisor; every call raises ApiUnavailable or ApiError on failure."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        self.url = url
        self._client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    @classmethod
    def for_config(cls, config: Config, token_file: Path) -> ApiClient:
        """A client for the supervisor ``config`` describes."""
        return cls.with_token_file(base_url(config.api.listen), token_file)

    @classmethod
    def with_token_file(cls, url: str, token_file: Path) -> ApiClient:
        """A client for the supervisor at ``url``, with the token ``token_file`` holds."""
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            raise ApiUnavailable(
                f"no supervisor has run with this state_dir yet (no token at {token_file}); "
                "start one with `herdsman run`"
            ) from None
        except OSError as exc:
            raise ApiUnavailable(
                f"cannot read the API token {token_file}: {exc.strerror}"
            ) from None
        return cls(url, token)

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        answers: Collection[int] = (),
    ) -> tuple[int, Any]:
        """Send a request; return the status and the decoded JSON body.

        An error status raises :class:`ApiError`, unless it is in ``answers``
        (a status whose body the caller reads, such as a rejected reload).
        """
        try:
            response = self._client.request(
                method,
                path,
                json=json,
                params={k: v for k, v in (params or {}).items() if v is not None},
                timeout=timeout if timeout is not None else self._client.timeout,
            )
        except httpx.ConnectError:
            raise ApiUnavailable(
                f"no supervisor answers at {self.url}; start one with `herdsman run -c FILE`"
            ) from None
        except httpx.HTTPError as exc:
            raise ApiUnavailable(f"the supervisor at {self.url} did not answer: {exc}") from None
        if response.headers.get("content-type", "").startswith("application/json"):
            body = response.json()
        else:
            body = response.text
        if response.status_code >= 400 and response.status_code not in answers:
            message = body.get("error") if isinstance(body, dict) else str(body)
            raise ApiError(response.status_code, str(message))
        return response.status_code, body
