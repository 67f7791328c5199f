"""Test-wide settings.

Hypothesis explores new examples on every developer run; under CI (``CI`` set)
it is derandomised, so a red CI run is reproducible from the same commit.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from postgres_support import fresh_schema, server_url

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers a core.

    Most tests wait on child processes, git, PostgreSQL and timers: one worker
    a core left the machine about half idle (the whole suite, quiet, two
    cores: 344 s with two workers, 233 s with four).
    """
    return 2 * (os.cpu_count() or 1)


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The URL of the test PostgreSQL server (see ``postgres_support``)."""
    return server_url()


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """A URL whose tables go in a schema of their own, dropped after the test."""
    with fresh_schema(postgres_server) as url:
        yield url
