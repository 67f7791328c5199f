"""PostgreSQL connection URLs: how libpq reads one, and how to name it safely.

Shared by the configuration checker (``[store] url``) and the PostgreSQL
store, so a URL the checker accepts is exactly one the store can use, and
neither ever prints a password.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from urllib.parse import unquote

__all__ = [
    "EXAMPLE_URL",
    "hide_password",
    "mask_passwords",
    "masked_url",
    "parse_postgres_url",
    "server_name",
]

SCHEMES = ("postgresql://", "postgres://")
EXAMPLE_URL = "postgresql://herdsman@db.example:5432/herdsman"

# The userinfo's password: what sits between "user:" and "@" in the authority
# of a URL anywhere in a text (a --set argument holds one after "KEY=").
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][\w+.-]*://[^/@?#\s\"']*?:)([^/@?#\s\"']*)(@)")
# A query parameter; libpq percent-decodes keys too, so ?pass%77ord= is a password.
_QUERY_PARAMETER = re.compile(r"([?&])([^=&#\s\"']*)=([^&#\s\"']*)")


def _is_password_key(key: str) -> bool:
    return unquote(key).strip().lower() == "password"


def _passwords_in(text: str) -> Iterator[str]:
    """Every password a URL in ``text`` carries, as written (percent-encoded or not)."""
    for match in _URL_PASSWORD.finditer(text):
        yield match.group(2)
    for match in _QUERY_PARAMETER.finditer(text):
        if _is_password_key(match.group(2)):
            yield match.group(3)


def hide_password(text: str, url: str, password: str | None = None) -> str:
    """``text`` with every copy of the URL's password (raw and decoded) replaced by ``***``."""
    secrets = {password} if password else set()
    for written in _passwords_in(url):
        secrets |= {written, unquote(written)}
    for secret in sorted(secrets - {""}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def mask_passwords(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``.

    Only where a password stands (after ``user:``, or as a ``password``
    query parameter however its key is encoded), so a password that happens
    to equal the user or database name hides nothing else.
    """
    shown = _URL_PASSWORD.sub(lambda m: f"{m[1]}***{m[3]}" if m[2] else m[0], text)
    return _QUERY_PARAMETER.sub(
        lambda m: f"{m[1]}{m[2]}=***" if m[3] and _is_password_key(m[2]) else m[0], shown
    )


def masked_url(url: str) -> str:
    """``url`` as it may be shown: its password, if any, replaced by ``***``."""
    return mask_passwords(url)


def parse_postgres_url(url: str) -> dict[str, str]:
    """libpq's reading of ``url`` (user, host, port, dbname, ...).

    Raises :class:`ValueError` whose message completes "store.url ..." and
    never contains the password.
    """
    # Imported here: psycopg takes a sixth of a second to import, and most
    # commands never read a PostgreSQL URL.
    from psycopg import ProgrammingError  # noqa: PLC0415
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    shown = masked_url(url)
    if not url.startswith(SCHEMES):
        raise ValueError(
            f"must be a PostgreSQL URL starting with postgresql://, e.g. {EXAMPLE_URL!r};"
            f" got {shown!r} (leave [store] url out to keep the ledger in SQLite in state_dir)"
        )
    try:
        params = {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    except ProgrammingError as exc:
        reason = hide_password(str(exc).strip(), url)
        raise ValueError(f"is not a URL libpq can read ({reason}): {shown!r}") from None
    if not (params.get("host") or params.get("hostaddr")):
        raise ValueError(
            f"must name the server's host, e.g. {EXAMPLE_URL!r}"
            f" (or ?host=/var/run/postgresql for a local socket); got {shown!r}"
        )
    for port in params.get("port", "").split(","):
        if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"has port {port!r}; a port is a number from 1 to 65535: {shown!r}")
    if not params.get("dbname"):
        raise ValueError(
            f"must name the database after the host, e.g. {EXAMPLE_URL!r}; got {shown!r}"
        )
    return params


def server_name(params: Mapping[str, str]) -> str:
    """The server and database a parsed URL points at, for messages: no user, no password."""
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    return f"PostgreSQL server {host} port {port}, database {params.get('dbname', '')!r}"
