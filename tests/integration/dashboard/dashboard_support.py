"""A supervisor whose runs end when the test says, served in the test's trio run."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from herdsman.runtime.main import Serving, serve
from herdsman.runtime.reload import ConfigSource

GATE_AGENT = Path(__file__).with_name("gate_agent.py")


def free_port() -> int:
    """A port nothing listens on now (the supervisor's file needs a number)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_config(directory: Path, *, concurrency: int = 1, extra: str = "") -> Path:
    """A supervisor.toml whose ``gate`` provider runs until ``directory/gates/<prompt>`` exists."""
    gates = directory / "gates"
    gates.mkdir(exist_ok=True)
    exec_ = f'["{sys.executable}", "{GATE_AGENT}", "{gates}"]'
    path = directory / "supervisor.toml"
    path.write_text(
        f"""\
[supervisor]
state_dir = "state"
shutdown_grace = "1s"

[providers.gate]
exec = {exec_}
concurrency = {concurrency}

[api]
listen = "127.0.0.1:{free_port()}"
{extra}
""",
        encoding="utf-8",
    )
    return path


def open_gate(directory: Path, prompt: str) -> None:
    """Let the run whose prompt is ``prompt`` finish."""
    (directory / "gates" / prompt).touch()


@attrs.define
class Served:
    """A supervisor serving its API and dashboard, and clients for both."""

    serving: Serving
    directory: Path
    token: str
    api: httpx.AsyncClient
    url: str

    def browser(self) -> httpx.AsyncClient:
        """A client with no token and no cookie, as a browser starts."""
        return httpx.AsyncClient(base_url=self.url, timeout=30)

    @asynccontextmanager
    async def logged_in(self) -> AsyncIterator[httpx.AsyncClient]:
        """A client that logged in through the form, holding only the cookie it got."""
        async with self.browser() as client:
            answer = await client.post("/login", data={"token": self.token})
            assert answer.status_code == 303, answer.text
            yield client


def git_repository(path: Path) -> Path:
    """A real git repository at ``path`` with one commit."""
    path.mkdir(parents=True)
    git = ["git", "-C", str(path), "-c", "user.email=t@t.invalid", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (path / "README.md").write_text("hello\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "-c", "commit.gpgsign=false", "commit", "-qm", "i"], check=True)
    return path


@pytest.fixture
async def served(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Served]:
    """A supervisor on a gate provider of concurrency 1, its file reloadable.

    Runs still going at the end are stopped after the second of grace.
    """
    async with serving(nursery, write_config(tmp_path)) as served:
        yield served


@pytest.fixture
async def served_with_repo(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Served]:
    """As ``served``, with a real git repository ``app`` checked out for each conversation."""
    repo = git_repository(tmp_path / "app")
    extra = f'[[repos]]\nname = "app"\npath = "{repo}"\n'
    async with serving(nursery, write_config(tmp_path, extra=extra)) as served:
        yield served


@asynccontextmanager
async def serving(nursery: trio.Nursery, path: Path) -> AsyncIterator[Served]:
    """The supervisor of the file at ``path``, served in ``nursery`` until the block ends."""
    tmp_path = path.parent
    source = ConfigSource(path, environ={}, watch=False)
    loaded = source.load()
    config = loaded.config
    stopped = trio.Event()

    async def run(task_status: trio.TaskStatus[Serving]) -> None:
        try:
            await serve(
                config, handle_signals=False, source=source, loaded=loaded, task_status=task_status
            )
        finally:
            stopped.set()

    serving: Serving = await nursery.start(run)
    token = config.api.token_file.read_text().strip()
    url = serving.urls[0]
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as api:
        yield Served(serving, tmp_path, token, api, url)
    serving.supervisor.request_shutdown()
    await stopped.wait()
