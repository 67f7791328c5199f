"""A configuration path that is no regular file of sane size: one line, on every command.

``herdsman check -c /dev/zero`` used to read until memory ran out; a FIFO
waited for a writer for ever. Each command that reads the configuration is
run for real, in a subprocess with a time limit, on each kind of non-file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from herdsman.config import ConfigError
from herdsman.config.load import read_config_text
from herdsman.runtime.config_watch import file_signature

#: Each command that reads the configuration file; FILE is where ``-c FILE`` goes.
COMMANDS = (
    ("check", "-c", "FILE"),
    ("config", "get", "-c", "FILE", "supervisor.state_dir"),
    ("config", "set", "-c", "FILE", "providers.demo.concurrency", "2"),
    ("run", "-c", "FILE"),
    ("submit", "-c", "FILE", "-p", "demo", "hello"),
    ("status", "-c", "FILE"),
    ("reload", "-c", "FILE"),
    ("runs", "-c", "FILE"),
    ("worktrees", "-c", "FILE"),
)


def non_files(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Each kind of path that is no configuration file, and what the error says it is."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    big = tmp_path / "big.toml"
    with big.open("wb") as file:
        file.truncate((1 << 20) + 1)  # 1 MiB, the documented limit, and a byte; sparse
    folder = tmp_path / "folder.toml"
    folder.mkdir()
    return {
        "device": (Path("/dev/zero"), "a character device, not a regular file"),
        "fifo": (fifo, "a named pipe (FIFO), not a regular file"),
        "folder": (folder, "a directory, not a regular file"),
        "big": (big, "larger than 1 MiB, too large for a configuration file"),
    }


@pytest.mark.parametrize("kind", ["device", "fifo", "folder", "big"])
def test_reading_it_is_refused_in_one_line(tmp_path: Path, kind: str) -> None:
    path, what = non_files(tmp_path)[kind]
    with pytest.raises(ConfigError) as caught:
        read_config_text(path)
    assert str(caught.value).startswith(f"{path}: cannot read file: {what}")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[: c.index("-c")]))
def test_every_command_says_what_is_wrong_in_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
    for path, what in non_files(tmp_path).values():
        argv = [str(path) if arg == "FILE" else arg for arg in command]
        result = subprocess.run(
            [sys.executable, "-m", "herdsman", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 1, (path, result.stderr)
        assert result.stderr.startswith(f"{path}: cannot read file: {what}"), result.stderr
        assert result.stderr.count("\n") == 1, result.stderr


def test_the_watch_never_reads_it_but_sees_it_change(tmp_path: Path) -> None:
    path, _ = non_files(tmp_path)["fifo"]
    assert file_signature(path) is not None  # returns at once: the FIFO is never opened
    assert file_signature(path) != file_signature(Path("/dev/zero"))
