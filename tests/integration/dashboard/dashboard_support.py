"""A supervisor whose runs end when the test says."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

GATE_AGENT = Path(__file__).with_name("gate_agent.py")


def free_port() -> int:
    """A port nothing listens on now (the supervisor's file needs a number)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_config(directory: Path, *, concurrency: int = 1) -> Path:
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
""",
        encoding="utf-8",
    )
    return path


def open_gate(directory: Path, prompt: str) -> None:
    """Let the run whose prompt is ``prompt`` finish."""
    (directory / "gates" / prompt).touch()
