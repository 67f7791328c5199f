"""A real supervisor on a real SQLite file, real processes and a real HTTP API."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, Protocol

import attrs
import httpx
import pytest
import trio

from herdsman.config import Config, LoadedConfig, load_config
from herdsman.runtime.main import Serving, serve, token_path
from herdsman.runtime.reload import ConfigSource
from herdsman.runtime.supervisor import Supervisor


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_config(
    directory: Path,
    *,
    concurrency: int = 2,
    max_concurrency: int | None = None,
    delay: float = 0.2,
    extra_provider: str = "",
    extra: str = "",
    shutdown_grace: str = "10m",
    preamble: bool = False,
) -> Path:
    """A supervisor.toml with a demo provider whose runs take ``delay`` seconds."""
    cap = f"max_concurrency = {max_concurrency}\n" if max_concurrency else ""
    exec_ = f'["{sys.executable}", "-m", "herdsman.demo_agent", "--delay", "{delay}"]'
    path = directory / "supervisor.toml"
    path.write_text(
        f"""\
[supervisor]
state_dir = "state"
shutdown_grace = "{shutdown_grace}"
parallel_preamble = {"true" if preamble else "false"}
{cap}
[providers.demo]
exec = {exec_}
concurrency = {concurrency}
{extra_provider}
[api]
listen = "127.0.0.1:{free_port()}"
{extra}
""",
        encoding="utf-8",
    )
    return path


def git_repository(path: Path) -> Path:
    """A real git repository at ``path`` with one commit (README.md)."""
    path.mkdir(parents=True)
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "t@t.invalid"],
        ["config", "user.name", "t"],
    ):
        subprocess.run(["git", "-C", str(path), *args], check=True)
    (path / "README.md").write_text("hello\n")
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(
        ["git", "-C", str(path), "-c", "commit.gpgsign=false", "commit", "-qm", "i"], check=True
    )
    return path


def config_at(path: Path) -> Config:
    return load_config(path, environ={}).config


@attrs.define
class Running:
    """A supervisor served in this test's trio run, and a client for it."""

    serving: Serving
    client: httpx.AsyncClient
    config: Config
    stopped: trio.Event

    @property
    def supervisor(self) -> Supervisor:
        return self.serving.supervisor

    async def wait(self, run_id: str, seconds: float = 20) -> dict[str, Any]:
        response = await self.client.get(f"/v1/runs/{run_id}", params={"wait": seconds})
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body


class Start(Protocol):
    """``await start(config)``, or ``await start(path, watch=...)`` to allow reloads."""

    def __call__(
        self, config_or_path: Config | Path, /, *, watch: bool = False
    ) -> Awaitable[Running]: ...


@pytest.fixture
async def start(nursery: trio.Nursery) -> AsyncIterator[Start]:
    """``await start(config)`` serves a supervisor and returns a :class:`Running`.

    Given the path of a config file instead, the supervisor can reload it
    (and, with ``watch``, does so when the file changes).
    """
    clients: list[httpx.AsyncClient] = []

    async def starter(config_or_path: Config | Path, *, watch: bool = False) -> Running:
        stopped = trio.Event()
        source: ConfigSource | None = None
        loaded: LoadedConfig | None = None
        if isinstance(config_or_path, Path):
            source = ConfigSource(config_or_path, environ={}, watch=watch)
            loaded = source.load()
            config = loaded.config
        else:
            config = config_or_path

        async def run(task_status: trio.TaskStatus[Serving]) -> None:
            try:
                await serve(
                    config,
                    handle_signals=False,
                    source=source,
                    loaded=loaded,
                    task_status=task_status,
                )
            finally:
                stopped.set()

        serving: Serving = await nursery.start(run)
        token = token_path(config).read_text().strip()
        client = httpx.AsyncClient(
            base_url=serving.urls[0], headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        clients.append(client)
        return Running(serving, client, config, stopped)

    yield starter
    for client in clients:
        await client.aclose()


async def unrecorded_finish(caplog: pytest.LogCaptureFixture, run_id: str) -> str:
    """The error logged, once it is, for a finish of ``run_id`` the ledger refused."""
    line = f"could not record how run {run_id} ended"
    with trio.fail_after(10):
        while line not in caplog.text:
            await trio.sleep(0.02)
    [message] = [r.getMessage() for r in caplog.records if line in r.getMessage()]
    return message
