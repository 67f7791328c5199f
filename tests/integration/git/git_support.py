"""Helpers shared by the git tests (a module, not a conftest, so tests can import it)."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path


def git_init(path: Path, files: Mapping[str, str]) -> None:
    """A real repository with one commit of ``files``; config is local to it."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(text.encode())

    def run(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    run("init", "-q", "-b", "main")
    run("config", "user.name", "herdsman tests")
    run("config", "user.email", "tests@herdsman.invalid")
    run("add", "-A")
    # A global commit.gpgsign=true must not make the fixture need a key.
    run("-c", "commit.gpgsign=false", "commit", "-q", "-m", "initial")
