"""Record sim/faults-recorded.jsonl: retries, a warning, a refused login and spend, for real.

A real supervisor (served in this process, a real SQLite ledger, real
processes) runs the stand-in agents of the integration tests, which print
the recorded Claude Code streams of tests/fixtures/agent_streams:

* ``claude`` on three accounts (``spend_agent.py``, the stream chosen by
  account): ``login`` is not logged in, so the first run is refused there
  (``needs_login``) and moves to ``near``, whose stream warns that it is
  near its limit (``near_limit``); the next conversation goes to ``spare``;
* ``agent`` (``retry_agent.py``, the endings in the prompt), retrying
  overloaded, rate-limited and crashed attempts up to three times with a
  1-2 s backoff: a run retried once then successful, one whose retries run
  out, one that called a tool before its 529 (not retried: it did work) and
  a crash retried once.

Every finish carries the spend its stream reported. Machine-specific paths
are replaced by ``/demo`` (the temporary folder) and ``/herdsman`` (this
repository), so the file is the same wherever it is recorded.

    .venv/bin/python sim/record_faults.py      # then: python sim/regenerate.py
"""

from __future__ import annotations

import socket
import sys
import tempfile
from pathlib import Path

import httpx
import trio

from herdsman.config import load_config
from herdsman.runtime.main import serve, token_path

HERE = Path(__file__).parent
REPOSITORY = HERE.parent.resolve()
AGENTS = REPOSITORY / "tests" / "integration" / "supervisor"
#: What each ``claude`` account's stand-in prints (a case of tests/fixtures/agent_streams).
STREAMS = {"login": "claude-not-logged-in", "near": "claude-usage-warning"}


def config_text(port: int, folder: Path) -> str:
    # Each stand-in keeps its own records (retry_agent counts attempts in its own).
    spend = f'["{sys.executable}", "{AGENTS / "spend_agent.py"}", "{folder / "spent.jsonl"}"]'
    retry = f'["{sys.executable}", "{AGENTS / "retry_agent.py"}", "{folder / "tried.jsonl"}"]'
    accounts = ""
    for name in ("login", "near", "spare"):
        home = folder / "homes" / name
        home.mkdir(parents=True)
        if name in STREAMS:
            (home / "stream").write_text(STREAMS[name])
        accounts += (
            f'[[providers.claude.accounts]]\nname = "{name}"\nwindow = "5h"\n'
            f'env = {{ CLAUDE_CONFIG_DIR = "{home}" }}\n'
        )
    return f"""\
[supervisor]
state_dir = "state"
parallel_preamble = false

[providers.claude]
exec = {spend}
protocol = "claude"
concurrency = 1
idle_timeout = "1h"

{accounts}
[providers.agent]
exec = {retry}
protocol = "claude"
concurrency = 2

[providers.agent.retry]
attempts = 3
on = ["overloaded", "rate_limit", "crash"]
backoff = "1s"
backoff_max = "2s"

[api]
listen = "127.0.0.1:{port}"
"""


async def record(folder: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = folder / "supervisor.toml"
    path.write_text(config_text(port, folder))
    config = load_config(path, environ={}).config
    async with trio.open_nursery() as nursery:
        serving = await nursery.start(
            lambda task_status: serve(config, handle_signals=False, task_status=task_status)
        )
        token = token_path(config).read_text().strip()
        async with httpx.AsyncClient(
            base_url=serving.urls[0], headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as client:

            async def run(provider: str, prompt: str, conversation: str) -> str:
                body = {"provider": provider, "prompt": prompt, "conversation": conversation}
                response = await client.post("/v1/runs", json=body)
                run_id: str = response.json()["id"]
                return run_id

            async def wait(run_id: str) -> None:
                await client.get(f"/v1/runs/{run_id}", params={"wait": 60})

            await wait(await run("claude", "work", "c1"))  # refused on login, moved to near
            await wait(await run("claude", "work", "c2"))  # near warned: spare
            endings = ("overloaded,success", "rate_limited", "tool_then_overloaded,success")
            ids = [await run("agent", ending, f"a{n}") for n, ending in enumerate(endings)]
            ids.append(await run("agent", "crash,success", "a3"))
            for run_id in ids:
                await wait(run_id)
        serving.supervisor.request_shutdown()


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name).resolve()
        trio.run(record, folder)
        [trace] = (folder / "state" / "traces").glob("*.jsonl")
        text = trace.read_text(encoding="utf-8")
    text = (
        text.replace(str(folder), "/demo")
        .replace(str(REPOSITORY), "/herdsman")
        .replace(sys.executable, "python3")
    )
    (HERE / "faults-recorded.jsonl").write_text(text, encoding="utf-8")
    print("wrote sim/faults-recorded.jsonl")


if __name__ == "__main__":
    main()
