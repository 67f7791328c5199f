"""What open dashboard pages cost the supervisor: its CPU per minute, idle and under load.

Starts a real ``herdsman run`` in a temporary folder (SQLite ledger, a
provider whose agent is ``cat``, four slots) and measures the supervisor
process's own CPU time (user + system, from ``/proc``; its agents' time is
not in it) over ``--seconds`` in four phases: no page and ``--pages`` pages
open, each idle and with ``--rate`` runs a minute submitted through the API.
A page here is what a browser's open dashboard asks of the server: the state
once, then the event stream (read over a plain socket in a thread, so the
pages cost this process, not the supervisor, their parsing).

It prints, per phase, the supervisor's CPU seconds per minute, the snapshots
each page received, and the machine's load average: on a shared machine the
figures move with the load, so compare phases of one run.

Run: python benchmarks/dashboard_cost.py [--seconds 60] [--pages 10] [--rate 100]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """The process's own user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Page:
    """One open dashboard: the event stream, counted, in a thread of this process."""

    def __init__(self, port: int, cookie: str) -> None:
        self.snapshots = 0
        self._sock = socket.create_connection(("127.0.0.1", port))
        request = (
            f"GET /dashboard/events HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
            f"Cookie: herdsman_session={cookie}\r\n\r\n"
        )
        self._sock.sendall(request.encode())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with self._sock:
            while chunk := self._sock.recv(1 << 16):
                self.snapshots += chunk.count(b"event: state\n")

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._thread.join()


def phase(
    name: str, pid: int, api: httpx.Client, pages: list[Page], *, seconds: float, rate: float
) -> None:
    before = [page.snapshots for page in pages]
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    submitted = 0
    while (elapsed := time.monotonic() - start) < seconds:
        if rate and submitted < elapsed * rate / 60:
            body = {"provider": "cat", "prompt": "x", "conversation": f"c{submitted % 20}"}
            api.post("/v1/runs", json=body).raise_for_status()
            submitted += 1
            continue
        time.sleep(0.01)
    elapsed = time.monotonic() - start
    used = cpu_seconds(pid) - start_cpu
    received = [page.snapshots - b for page, b in zip(pages, before, strict=True)]
    per_page = f"{min(received)}..{max(received)}" if received else "-"
    load = os.getloadavg()[0]
    print(
        f"{name:<28} {used / elapsed * 60:7.2f} CPU s/min  {submitted:4d} runs  "
        f"snapshots/page {per_page:>9}  load {load:.2f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each phase")
    parser.add_argument("--pages", type=int, default=10, help="dashboard pages open")
    parser.add_argument("--rate", type=float, default=100.0, help="runs a minute under load")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder)
        port = free_port()
        (directory / "supervisor.toml").write_text(
            f"""\
[supervisor]
state_dir = "state"
shutdown_grace = "5s"

[providers.cat]
exec = ["cat"]
concurrency = 4

[api]
listen = "127.0.0.1:{port}"
""",
            encoding="utf-8",
        )
        with (directory / "supervisor.log").open("w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "herdsman", "run", "-c", "supervisor.toml"],
                cwd=directory,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 30
            while "herdsman is running" not in (directory / "supervisor.log").read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    sys.exit((directory / "supervisor.log").read_text())
                time.sleep(0.1)
            url = f"http://127.0.0.1:{port}"
            token = (directory / "state" / "api-token").read_text().strip()
            with (
                httpx.Client(
                    base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
                ) as api,
                httpx.Client(base_url=url) as browser,
            ):
                assert browser.post("/login", data={"token": token}).status_code == 303
                cookie = browser.cookies["herdsman_session"]
                print(f"uptime: {os.getloadavg()}; {os.cpu_count()} CPUs; {args.seconds:g} s/phase")
                phase("no page, idle", process.pid, api, [], seconds=args.seconds, rate=0)
                phase("no page, load", process.pid, api, [], seconds=args.seconds, rate=args.rate)
                pages = []
                for _ in range(args.pages):
                    browser.get("/dashboard/state").raise_for_status()
                    pages.append(Page(port, cookie))
                time.sleep(2)
                phase(
                    f"{args.pages} pages, idle",
                    process.pid,
                    api,
                    pages,
                    seconds=args.seconds,
                    rate=0,
                )
                phase(
                    f"{args.pages} pages, load",
                    process.pid,
                    api,
                    pages,
                    seconds=args.seconds,
                    rate=args.rate,
                )
                for page in pages:
                    page.close()
        finally:
            process.terminate()
            process.wait(60)


if __name__ == "__main__":
    main()
