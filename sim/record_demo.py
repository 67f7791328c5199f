"""Record sim/demo-recorded.jsonl: a real supervisor, real processes, the demo agent.

Two providers running the demo agent (one on two accounts), several
conversations, two slots each. Machine-specific paths in the trace are
replaced by ``/demo`` so the file is the same wherever it is recorded.

    .venv/bin/python sim/record_demo.py      # then: python sim/regenerate.py
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


def config_text(port: int) -> str:
    demo = f'["{sys.executable}", "-m", "herdsman.demo_agent", "--delay", "0.4"]'
    return f"""\
[supervisor]
state_dir = "state"
parallel_preamble = false

[providers.demo]
exec = {demo}
concurrency = 2

[providers.second]
exec = {demo}
concurrency = 2

[[providers.second.accounts]]
name = "a"
concurrency = 1

[[providers.second.accounts]]
name = "b"
concurrency = 1

[api]
listen = "127.0.0.1:{port}"
"""


async def record(folder: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = folder / "supervisor.toml"
    path.write_text(config_text(port))
    config = load_config(path, environ={}).config
    async with trio.open_nursery() as nursery:
        serving = await nursery.start(
            lambda task_status: serve(config, handle_signals=False, task_status=task_status)
        )
        token = token_path(config).read_text().strip()
        async with httpx.AsyncClient(
            base_url=serving.urls[0], headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as client:
            ids: list[str] = []

            async def batch(provider: str, conversations: list[str]) -> None:
                runs = [
                    {"provider": provider, "prompt": "go", "conversation": c} for c in conversations
                ]
                response = await client.post("/v1/runs/batch", json={"runs": runs})
                ids.extend(r["run"]["id"] for r in response.json()["results"])

            await batch("demo", ["x0", "x1", "x0", "x2", "x1", "x3", "x3", "x2"])
            await trio.sleep(0.2)
            await batch("second", ["y0", "y1", "y0", "y2", "y1", "y2"])
            for run_id in ids:
                await client.get(f"/v1/runs/{run_id}", params={"wait": 60})
        serving.supervisor.request_shutdown()


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name).resolve()
        trio.run(record, folder)
        [trace] = (folder / "state" / "traces").glob("*.jsonl")
        text = trace.read_text(encoding="utf-8")
    text = text.replace(str(folder), "/demo").replace(sys.executable, "python3")
    (HERE / "demo-recorded.jsonl").write_text(text, encoding="utf-8")
    print("wrote sim/demo-recorded.jsonl")


if __name__ == "__main__":
    main()
