"""The token, the ledger, the lock, logs and the pointer: never used through a link."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from herdsman.runtime.api.server import ensure_token
from herdsman.runtime.lockfile import StateDirLock
from herdsman.runtime.pointer import read_pointer, write_pointer
from herdsman.runtime.store import SqliteStore, StoreError


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def test_a_link_at_the_token_file_is_neither_read_nor_written(tmp_path: Path) -> None:
    target = victim(tmp_path)
    token = tmp_path / "state" / "api-token"
    token.parent.mkdir()
    token.symlink_to(target)
    with pytest.raises(OSError, match="api-token"):
        ensure_token(token)
    token.unlink()
    token.symlink_to(tmp_path / "nothing-yet")  # a dangling one: O_EXCL refuses it too
    with pytest.raises(OSError, match="api-token"):
        ensure_token(token)
    assert not (tmp_path / "nothing-yet").exists()
    assert target.read_text() == "precious\n"


@pytest.mark.parametrize("name", ["herdsman.db", "herdsman.db-wal", "herdsman.db-shm"])
def test_a_link_at_the_ledger_or_its_side_files_is_refused(tmp_path: Path, name: str) -> None:
    target = victim(tmp_path)
    (tmp_path / name).symlink_to(target)
    with pytest.raises(StoreError, match=rf"{name}' is a symbolic link"):
        SqliteStore(tmp_path / "herdsman.db")
    assert target.read_text() == "precious\n"


def test_a_link_at_the_lock_file_is_refused(tmp_path: Path) -> None:
    target = victim(tmp_path)
    (tmp_path / "supervisor.lock").symlink_to(target)
    with pytest.raises(OSError, match=r"supervisor\.lock"), StateDirLock(tmp_path):
        pass
    assert target.read_text() == "precious\n"


def test_herdsman_logs_never_reads_through_a_link(tmp_path: Path) -> None:
    config = tmp_path / "supervisor.toml"
    config.write_text('[supervisor]\nstate_dir = "state"\n[providers.demo]\nexec = ["demo"]\n')
    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True)
    (logs / "r1.log").symlink_to("/dev/zero")  # read, it would never end
    (logs / "r2.log").symlink_to(victim(tmp_path))
    for run_id in ("r1", "r2"):
        result = subprocess.run(
            [sys.executable, "-m", "herdsman", "logs", "-c", str(config), run_id],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr.startswith(f"herdsman: {logs / run_id}.log is a symbolic link; ")
        assert result.stderr.count("\n") == 1


def test_the_pointer_is_never_written_or_read_through_a_link(tmp_path: Path) -> None:
    environ = {"XDG_RUNTIME_DIR": str(tmp_path / "run")}
    config = tmp_path / "supervisor.toml"
    config.touch()
    written = write_pointer(config, "http://127.0.0.1:1", tmp_path / "token", environ)
    assert written is not None
    assert read_pointer(config, environ) is not None  # this process is alive
    target = victim(tmp_path)
    # Its temporary file's name is predictable: a link planted there is replaced.
    written.with_suffix(f".{os.getpid()}.tmp").symlink_to(target)
    assert write_pointer(config, "http://127.0.0.1:2", tmp_path / "token", environ) == written
    assert target.read_text() == "precious\n"
    written.unlink()
    written.symlink_to(target)
    assert read_pointer(config, environ) is None
