"""Record sim/stop-*.jsonl: a real supervisor stopped every way, one trace file per life.

`herdsman run` as a real process on a copy-like configuration (the demo
agent, a provider with a timeout, a second provider on two accounts, a real
git repository with a worktree per conversation), driven over its HTTP API:

1. ``stop-forced``: submits, a skip, cancels of a queued and a running run,
   a timeout, a valid reload and a rejected one; then SIGINT (drain) and a
   second SIGINT (forced stop: the three long runs are cancelled).
2. ``stop-killed``: the next start restates the queued runs and starts
   them; more are submitted; then SIGKILL: the file simply ends.
3. ``stop-restarted``: the next start finds the killed one's runs lost and
   runs what was queued; SIGTERM drains it once they are done.

Machine-specific paths are replaced by ``/demo``, so the files are the same
wherever they are recorded (but for the run ids and times).

    .venv/bin/python sim/record_stops.py      # then: python sim/regenerate.py
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).parent
NAMES = ("stop-forced", "stop-killed", "stop-restarted")


def config_text(port: int, *, second_slots: int = 2, broken: bool = False) -> str:
    demo = f'["{sys.executable}", "-m", "herdsman.demo_agent", "--delay", "1"]'
    slow = f'["{sys.executable}", "-m", "herdsman.demo_agent", "--delay", "30"]'
    return f"""\
[supervisor]
state_dir = "state"
parallel_preamble = false
shutdown_grace = "1m"

[providers.demo]
exec = {demo}
concurrency = 2

[providers.slow]
exec = {slow}
concurrency = 1
timeout = "2s"

[providers.long]
exec = {slow}
concurrency = 3

[providers.second]
exec = {demo}
concurrency = {0 if broken else second_slots}

[[providers.second.accounts]]
name = "a"
concurrency = 1

[[providers.second.accounts]]
name = "b"
concurrency = 1

[[repos]]
name = "repo"
path = "repo"

[retention]
idle = "0s"
sweep_interval = "5s"

[api]
listen = "127.0.0.1:{port}"
"""


class Life:
    """One ``herdsman run`` process in ``folder`` (in ``env``, else this one's) and its API."""

    def __init__(self, folder: Path, port: int, env: Mapping[str, str] | None = None) -> None:
        self.folder = folder
        self.log = (folder / "supervisor.log").open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "herdsman", "run", "-c", "supervisor.toml"],
            cwd=folder,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        token_file = folder / "state" / "api-token"
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, "the supervisor stopped at once"
            assert time.monotonic() < deadline, "the supervisor did not come up"
            try:
                token = token_file.read_text().strip()
                self.client.headers["Authorization"] = f"Bearer {token}"
                if self.client.get("/v1/status").status_code == 200:
                    break
            except (OSError, httpx.HTTPError):
                pass
            time.sleep(0.1)

    def submit(self, provider: str, conversation: str, **extra: Any) -> str:
        body = {"provider": provider, "prompt": "go", "conversation": conversation, **extra}
        response = self.client.post("/v1/runs", json=body)
        assert response.status_code in (200, 201), response.text
        run_id: str = response.json()["id"]
        return run_id

    def status(self, run_id: str, wait: float = 0) -> str:
        params = {"wait": wait} if wait else {}
        status: str = self.client.get(f"/v1/runs/{run_id}", params=params).json()["status"]
        return status

    def until(self, run_id: str, status: str) -> None:
        deadline = time.monotonic() + 60
        while self.status(run_id) != status:
            assert time.monotonic() < deadline, f"{run_id} never became {status}"
            time.sleep(0.05)

    def stop(self, *signums: signal.Signals) -> None:
        self.client.close()
        for n, signum in enumerate(signums):
            if n:
                time.sleep(0.5)
            self.process.send_signal(signum)
        self.process.wait(120)
        self.log.close()


def init_repository(path: Path) -> None:
    """A real git repository at ``path``, one commit on ``main``."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    (path / "README.md").write_text("hello\n")
    git = ["git", "-C", str(path), "-c", "user.email=d@d.invalid", "-c", "user.name=d"]
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "-c", "commit.gpgsign=false", "commit", "-qm", "init"], check=True)


def record(folder: Path) -> None:
    init_repository(folder / "repo")
    config = folder / "supervisor.toml"
    port = free_port()
    config.write_text(config_text(port))

    life = Life(folder, port)
    x0 = life.submit("demo", "x0")
    life.submit("demo", "x1")
    life.submit("demo", "x0")  # queued behind x0's run
    life.submit("demo", "x0", on_busy="skip")  # refused: x0 is busy
    doomed = life.submit("demo", "x2")  # queued: both slots taken
    life.client.post(f"/v1/runs/{doomed}/cancel")
    slow = life.submit("slow", "t0")  # times out after 2 s
    life.status(x0, wait=30)
    for conversation in ("y0", "y1", "y0", "y2"):
        life.submit("second", conversation)
    config.write_text(config_text(port, broken=True))
    life.client.post("/v1/reload")  # rejected
    config.write_text(config_text(port, second_slots=1))
    life.client.post("/v1/reload")  # applied
    running = life.submit("demo", "x3")
    life.until(running, "running")
    life.client.post(f"/v1/runs/{running}/cancel")
    life.status(running, wait=30)
    life.status(slow, wait=30)
    last = [life.submit("long", c) for c in ("z0", "z1", "z2", "z3")]
    life.until(last[2], "running")
    life.stop(signal.SIGINT, signal.SIGINT)  # the second cancels what runs

    life = Life(folder, port)  # z3 was left queued
    life.until(last[3], "running")
    for conversation in ("w0", "w1", "w2"):
        life.submit("demo", conversation)
    life.stop(signal.SIGKILL)

    life = Life(folder, port)  # z3 and two w runs lost, one w run queued again
    for run_id in [r["id"] for r in life.client.get("/v1/runs").json()["runs"]]:
        life.status(run_id, wait=60)
    life.stop(signal.SIGTERM)


def free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name).resolve()
        try:
            record(folder)
        except BaseException:
            print((folder / "supervisor.log").read_text(), file=sys.stderr)
            raise
        files = sorted((folder / "state" / "traces").glob("*.jsonl"))
        assert len(files) == len(NAMES), files
        for trace, out in zip(files, NAMES, strict=True):
            text = trace.read_text(encoding="utf-8")
            text = text.replace(str(folder), "/demo").replace(sys.executable, "python3")
            (HERE / f"{out}.jsonl").write_text(text, encoding="utf-8")
            print(f"wrote sim/{out}.jsonl")


if __name__ == "__main__":
    main()
