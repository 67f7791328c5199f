"""The class of an API failure a run met, from an HTTP status or a provider's message.

Claude Code names the class itself (``api_retry``'s ``error``, an assistant
message's ``error``); Codex says it only in English (``Reconnecting... 2/5
(unexpected status 401 Unauthorized: …)``, ``We're currently experiencing
high demand …``), so its text is matched against the phrases below, the
first that matches deciding. A usage-limit message is no failure class: the
usage limit speaks for it (``UsageLimit``).
"""

from __future__ import annotations

import enum
import re
from typing import Final

from herdsman.runtime.runner.usage import CLAUDE_LIMIT_RE, CODEX_LIMIT_RE


class ApiFailure(enum.StrEnum):
    """The class of an API failure, for a later rule on retries and accounts.

    The values are Claude Code's own names for them where it has one.
    """

    OVERLOADED = "overloaded"
    """The provider is at capacity (HTTP 529)."""
    SERVER_ERROR = "server_error"
    """The provider failed (HTTP 5xx; Codex's "high demand")."""
    RATE_LIMIT = "rate_limit"
    """Too many requests (HTTP 429), with no usage limit that names its reset."""
    CONNECTION = "connection"
    """No answer at all: the network, DNS, a dropped stream."""
    AUTHENTICATION = "authentication_failed"
    """Not logged in, or the credentials were refused (HTTP 401, 403)."""
    BILLING = "billing_error"
    """The account cannot pay for the request."""
    INVALID_REQUEST = "invalid_request"
    """The provider refused the request itself (HTTP 400, 404, 413, 422)."""
    OTHER = "api_error"
    """Any other API error the stream reported."""


def failure_of_status(status: int) -> ApiFailure:
    """The class of an HTTP error status."""
    if status == 529:
        return ApiFailure.OVERLOADED
    if status == 429:
        return ApiFailure.RATE_LIMIT
    if status in (401, 403):
        return ApiFailure.AUTHENTICATION
    if status == 402:
        return ApiFailure.BILLING
    if status >= 500:
        return ApiFailure.SERVER_ERROR
    if status in (400, 404, 413, 422):
        return ApiFailure.INVALID_REQUEST
    return ApiFailure.OTHER


_NAMED: Final = {failure.value: failure for failure in ApiFailure} | {
    # Claude Code's other names for the same classes.
    "authentication_error": ApiFailure.AUTHENTICATION,
    "overloaded_error": ApiFailure.OVERLOADED,
    "rate_limit_error": ApiFailure.RATE_LIMIT,
    "invalid_request_error": ApiFailure.INVALID_REQUEST,
}


def failure_of_name(name: str) -> ApiFailure | None:
    """The class Claude Code names (``rate_limit``, ``overloaded``, …), or None for another name."""
    return _NAMED.get(name)


_STATUS: Final = re.compile(r"\b(?:status|HTTP)\s*:?\s*([1-5]\d\d)\b", re.IGNORECASE)

_PHRASES: Final = (
    (
        ApiFailure.AUTHENTICATION,
        r"unauthori[sz]ed|not logged in|log ?in again|invalid[ _]api[ _]key|incorrect api key"
        r"|authentication|forbidden",
    ),
    (ApiFailure.BILLING, r"billing|insufficient[ _]quota|credit balance|payment required"),
    (ApiFailure.RATE_LIMIT, r"rate[ _]limit|too many requests"),
    (ApiFailure.OVERLOADED, r"overloaded|at capacity"),
    (
        ApiFailure.SERVER_ERROR,
        r"high demand|internal server error|server[ _]error|service unavailable|bad gateway"
        r"|gateway timeout",
    ),
    (
        ApiFailure.CONNECTION,
        r"stream disconnected|connection|network|timed out|lookup address|error sending request"
        r"|reset by peer",
    ),
)
_PATTERNS: Final = tuple((failure, re.compile(pattern, re.I)) for failure, pattern in _PHRASES)


def status_in(text: str) -> int | None:
    """The HTTP status a provider's message names (``status 401``, ``HTTP 529``), if any."""
    found = _STATUS.search(text)
    return int(found.group(1)) if found is not None else None


def failure_of_text(text: str) -> ApiFailure | None:
    """The class of the failure a provider's message describes; None for a usage limit.

    An HTTP status in the text (``status 401``, ``HTTP 529``) decides; else
    the first class whose phrases appear; else :attr:`ApiFailure.OTHER`.
    """
    if CODEX_LIMIT_RE.search(text) or CLAUDE_LIMIT_RE.search(text):
        return None
    status = status_in(text)
    if status is not None:
        return failure_of_status(status)
    for failure, pattern in _PATTERNS:
        if pattern.search(text):
            return failure
    return ApiFailure.OTHER
