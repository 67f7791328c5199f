"""Under umask 022, everything ``herdsman run`` makes in its state directory is private.

The ledger holds every prompt and result, logs every agent's output, traces
every run's identity, the token opens the API: files ``0600``, folders
``0700``, SQLite's side files included. The checkouts' own files are git's
(the agent's work, in a ``0700`` conversation folder) and are not looked at.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cli_support import CLI, Supervisor, herdsman
from supervisor_support import git_repository, write_config

from herdsman.runtime.lockfile import StateDirLock
from herdsman.runtime.state_paths import make_private_dirs, open_below, read_below, replace_below
from herdsman.runtime.store import SqliteStore


def modes_under(state: Path) -> dict[str, int]:
    """Each path under ``state`` herdsman made, relative, and its permission bits."""
    found = {}
    for folder, dirs, files in os.walk(state):
        here = Path(folder)
        relative = here.relative_to(state)
        if len(relative.parts) == 2 and relative.parts[0] == "worktrees":
            dirs[:] = [d for d in dirs if not (here / d / ".git").exists()]  # checkouts
        for name in [*dirs, *files]:
            path = here / name
            found[str(path.relative_to(state))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def test_everything_in_the_state_dir_is_private_whatever_the_umask(tmp_path: Path) -> None:
    repo = git_repository(tmp_path / "repo")
    write_config(tmp_path, extra=f'[[repos]]\nname = "app"\npath = "{repo}"\n')
    old = os.umask(0o022)
    try:
        supervisor = Supervisor(tmp_path)  # the child inherits the umask
    finally:
        os.umask(old)
    try:
        done = herdsman(
            *("submit", *CLI, "-p", "demo", "--conversation", "c1", "--wait", "hi"), cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        state = tmp_path / "state"
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        modes = modes_under(state)
    finally:
        supervisor.stop()
        supervisor.close()
    # What a run leaves, the ledger's WAL side files among it (open while it runs).
    expected = {"herdsman.db", "herdsman.db-wal", "herdsman.db-shm", "api-token", "supervisor.lock"}
    assert expected <= set(modes), sorted(modes)
    assert any(name.startswith("logs/") for name in modes)
    assert any(name.startswith("traces/trace-") for name in modes)
    assert any(name.endswith(".herdsman-conversation.json") for name in modes)
    wrong = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode != (0o700 if (state / name).is_dir() else 0o600)
    }
    assert wrong == {}


def test_an_older_herdsmans_readable_ledger_and_lock_are_tightened(tmp_path: Path) -> None:
    for name in ("herdsman.db", "supervisor.lock"):
        (tmp_path / name).touch(mode=0o644)
        (tmp_path / name).chmod(0o644)
    SqliteStore(tmp_path / "herdsman.db").close()
    with StateDirLock(tmp_path):
        pass
    for name in ("herdsman.db", "supervisor.lock"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name


def test_an_older_herdsmans_readable_folders_are_tightened_when_made_private(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    for folder in ("traces", "worktrees/c1-x"):
        (state / folder).mkdir(parents=True)
        (state / folder).chmod(0o755)
    state.chmod(0o755)
    make_private_dirs(state, state / "traces")
    make_private_dirs(state, state / "worktrees" / "c1-x")
    modes = {name: oct(mode) for name, mode in modes_under(state).items()}
    assert modes == {"traces": "0o700", "worktrees": "0o700", "worktrees/c1-x": "0o700"}
    # The state directory itself is the user's to set: left as it is.
    assert stat.S_IMODE(state.stat().st_mode) == 0o755


def test_a_file_opened_below_leaves_the_folders_on_its_way_as_they_are(tmp_path: Path) -> None:
    # A run's log may be anywhere (/dev/full, anchored at /): its folders are not ours.
    (tmp_path / "dev").mkdir(mode=0o755)
    (tmp_path / "dev").chmod(0o755)
    os.close(open_below(tmp_path, tmp_path / "dev" / "full", os.O_WRONLY | os.O_CREAT))
    replace_below(tmp_path, tmp_path / "dev" / "meta.json", b"{}")
    assert read_below(tmp_path, tmp_path / "dev" / "full", limit=10) == b""
    assert stat.S_IMODE((tmp_path / "dev").stat().st_mode) == 0o755


def test_a_start_tightens_an_older_herdsmans_readable_logs_folder(tmp_path: Path) -> None:
    write_config(tmp_path)
    logs = tmp_path / "state" / "logs"
    logs.mkdir(parents=True)
    logs.chmod(0o755)
    supervisor = Supervisor(tmp_path)
    try:
        assert stat.S_IMODE(logs.stat().st_mode) == 0o700
    finally:
        supervisor.stop()
        supervisor.close()
