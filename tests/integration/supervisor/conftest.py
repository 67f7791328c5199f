"""Fixtures of the supervisor integration tests (helpers live in supervisor_support)."""

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from commit_cut_proxy import CommitCutProxy
from fleet_support import closing, fleet_url
from supervisor_support import start

__all__ = ["closing", "fleet_url", "proxy", "start"]


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[CommitCutProxy]:
    """A proxy to the test PostgreSQL server that can cut, drop or refuse connections."""
    server = urlsplit(postgres_url)
    assert server.hostname is not None
    cutter = CommitCutProxy(server.hostname, server.port or 5432)
    yield cutter
    cutter.close()
