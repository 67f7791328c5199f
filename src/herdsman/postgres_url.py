"""PostgreSQL connection URLs: how libpq reads one, and how to name it safely.

Shared by the configuration checker (``[store] url``) and the PostgreSQL
store, so a URL the checker accepts is exactly one the store can use, and
neither ever prints a password.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["EXAMPLE_URL", "hide_password", "masked_url", "parse_postgres_url", "server_name"]

SCHEMES = ("postgresql://", "postgres://")
EXAMPLE_URL = "postgresql://herdsman@db.example:5432/herdsman"

# The userinfo's password: what sits between "user:" and "@" in the authority.
_URL_PASSWORD = re.compile(r"^(\w+://[^/@?#]*?:)([^/@?#]*)(@)")


def hide_password(text: str, url: str, password: str | None = None) -> str:
    """``text`` with every copy of the URL's password (raw and decoded) replaced by ``***``."""
    secrets = [password] if password else []
    match = _URL_PASSWORD.match(url)
    if match and match.group(2):
        secrets.append(match.group(2))
    # The query parameter form, ?password=..., too.
    secrets += [m.group(1) for m in re.finditer(r"[?&]password=([^&#]*)", url) if m.group(1)]
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def masked_url(url: str) -> str:
    """``url`` as it may be shown: the password, if any, replaced by ``***``.

    Only where a password stands (after ``user:``, or as ``password=``), so
    a password that happens to equal the user or database name hides nothing else.
    """
    shown = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}***{m.group(3)}" if m.group(2) else m[0], url)
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", shown)


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
