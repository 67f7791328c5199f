"""A real PostgreSQL server for the tests: where it is, and a fresh schema per test.

``.ci/start-postgres`` installs and starts the distribution's server and
prints the URL; the tests read it from ``HERDSMAN_TEST_POSTGRES_URL``.
Without a reachable server the PostgreSQL tests are skipped, with a message
saying how to get one; under CI (``CI`` set) they fail instead, so a CI run
can never pass without having run them.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg
import pytest

from herdsman.postgres_url import masked_url

if TYPE_CHECKING:
    from herdsman.runtime.store.fleet import FleetStore

URL_VARIABLE = "HERDSMAN_TEST_POSTGRES_URL"


def server_url() -> str:
    """The test server's URL; skips (fails under CI) when there is no server to reach."""
    url = os.environ.get(URL_VARIABLE)
    if not url:
        _unavailable(f"{URL_VARIABLE} is not set")
    assert url is not None
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        _unavailable(f"cannot reach {masked_url(url)} ({str(exc).strip()})")
    return url


def _unavailable(why: str) -> None:
    message = (
        f"needs a PostgreSQL server: {why}. Start one with"
        f' `export {URL_VARIABLE}="$(sudo .ci/start-postgres)"`'
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def with_search_path(url: str, schema: str) -> str:
    """``url`` with its connections' tables in ``schema``."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


@contextmanager
def fresh_schema(url: str) -> Iterator[str]:
    """A new, empty schema on the server for one test; yields a URL that uses it.

    A schema, not a database: creating one costs a millisecond, a database
    a checkpoint.
    """
    schema = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_search_path(url, schema)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def split_password(url: str) -> tuple[str, str | None]:
    """``url`` without its password, and the password (what ``PGPASSWORD`` would carry).

    ``[store] url`` refuses a password, so a supervisor under test gets it
    from the environment, as one in production would.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url, None
    user = f"{parts.username}@" if parts.username else ""
    netloc = user + parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), parts.password


def fleet_lock_waiters(key: int) -> str:
    """SQL counting the sessions that wait for the fleet lock ``key`` (of one ledger).

    Only that lock: pg_locks shows the whole server, where other test
    sessions' transactions may be waiting as well.
    """
    return (
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'advisory'"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        f" AND classid = {key >> 32} AND objid = {key & 0xFFFFFFFF} AND objsubid = 1"
    )


def ledger_member(url: str, name: str, lease: float = 60.0) -> FleetStore:
    """A fleet member of the ledger at ``url`` alone (no supervisor): host ``name``, pid 100.

    Its id begins with ``name``. It expires other members as soon as their
    lease ends, without the margin left for their fences: the ledger's own
    rules, tested with leases of a fraction of a second.
    """
    from herdsman.runtime.store.fleet import FleetStore

    return FleetStore(
        url,
        member_id=f"{name}-{uuid.uuid4().hex[:8]}",
        host=name,
        pid=100,
        lease=lease,
        margin=0.0,
    )


#: The server's clock in unix seconds at the moment of the statement, as the ledger reads it.
SERVER_CLOCK = "extract(epoch FROM clock_timestamp())::double precision"


def end_lease(url: str, member_id: str, ago: float = 0.0) -> None:
    """End the lease of ``member_id`` ``ago`` seconds before now, on the server's clock.

    As if the member had been frozen (a stopped VM) for longer than its
    lease: what a test would otherwise wait for with a short lease and a
    sleep, which a loaded machine turns into a lease lapsed too early (before
    the member's own claim) or too late.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        updated = conn.execute(
            f"UPDATE supervisors SET lease_until = {SERVER_CLOCK} - %s WHERE id = %s",
            (ago, member_id),
        ).rowcount
    assert updated == 1, f"no member {member_id} in the ledger"


def lease_left(url: str, member_id: str) -> float:
    """How many seconds the lease of ``member_id`` still holds, on the server's clock."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT lease_until - {SERVER_CLOCK} FROM supervisors WHERE id = %s", (member_id,)
        ).fetchone()
    assert row is not None, f"no member {member_id} in the ledger"
    return float(row[0])
