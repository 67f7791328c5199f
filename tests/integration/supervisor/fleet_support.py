"""Fleets of real `herdsman run` processes: their URL, their API clients, their cleanup."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import pytest
from cli_support import Supervisor

from postgres_support import split_password

__all__ = ["client", "closing", "fleet_toml", "fleet_url"]


@pytest.fixture
def fleet_url(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test schema's URL without its password, which the members inherit instead."""
    url, password = split_password(postgres_url)
    if password is not None:  # as from a service's environment
        monkeypatch.setenv("PGPASSWORD", password)
    return url


@pytest.fixture
def closing() -> Iterator[list[Supervisor]]:
    """Members the test appends; each is killed (resumed first if paused) and reaped after."""
    members: list[Supervisor] = []
    yield members
    for member in members:
        if member.process.poll() is None:
            member.process.send_signal(signal.SIGCONT)  # a test may have paused it
        member.close()


def client(member: Supervisor) -> httpx.Client:
    """An API client of ``member``, with its token."""
    config = (member.directory / "supervisor.toml").read_text()
    listen = config.split('listen = "', 1)[1].split('"', 1)[0]
    token = (member.directory / "state" / "api-token").read_text().strip()
    return httpx.Client(
        base_url=f"http://{listen}", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def fleet_toml(url: str, *, lease: str = "3s", poll: str = "1s", more: str = "") -> str:
    """The ``[store]`` and ``[fleet]`` tables of a member on ``url`` (``more``: further keys)."""
    return (
        f'[store]\nurl = "{url}"\n[fleet]\nenabled = true\nlease = "{lease}"\n'
        f'poll = "{poll}"\n{more}'
    )
