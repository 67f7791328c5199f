"""The dashboard's login: a cookie derived from the API token, and cross-site checks.

Logging in with the API's bearer token sets a session cookie whose value is
an HMAC of the token: it proves the token was known, cannot be turned back
into it (nor used as a bearer token), and stops working when the token
file is replaced. The cookie is ``HttpOnly`` (no script reads it) and
``SameSite=Strict`` (no other site's page sends it). Every action also
carries a second HMAC of the token in a header, which only the dashboard's
own page knows (it is written into the page), and a request whose
``Origin`` is another site's is refused whatever it carries.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection

#: The session cookie's name.
COOKIE = "herdsman_session"
#: The header an action carries the page's anti-forgery token in.
CSRF_HEADER = "x-herdsman-csrf"
#: How long a login lasts in the browser (a week); the token's replacement ends it sooner.
COOKIE_MAX_AGE = 7 * 24 * 3600


class Keys:
    """The values derived from one API token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()
        self.session = self._derive(b"herdsman dashboard session")
        self.csrf = self._derive(b"herdsman dashboard csrf")

    def _derive(self, purpose: bytes) -> str:
        return hmac.new(self._token, purpose, hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        """Whether ``given`` is the API token (in constant time)."""
        return secrets.compare_digest(given.strip().encode(), self._token)

    def logged_in(self, connection: HTTPConnection) -> bool:
        """Whether the request carries the session cookie."""
        cookie = connection.cookies.get(COOKIE, "")
        return secrets.compare_digest(cookie.encode(), self.session.encode())

    def csrf_matches(self, connection: HTTPConnection) -> bool:
        """Whether the request carries the page's anti-forgery token."""
        given = connection.headers.get(CSRF_HEADER, "")
        return secrets.compare_digest(given.encode(), self.csrf.encode())


def same_origin(connection: HTTPConnection) -> bool:
    """Whether the request comes from a page of this server (or says nothing of where).

    Browsers send ``Origin`` with every POST; a request without one comes
    from no browser page (curl, a test), which the cookie alone governs.
    """
    origin = connection.headers.get("origin")
    if origin is None:
        return True
    host = connection.headers.get("host", "")
    return urlsplit(origin).netloc == host


def cookie_header(value: str, max_age: int) -> str:
    """A ``Set-Cookie`` value for the session cookie (``max_age`` 0 removes it)."""
    return f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}"
