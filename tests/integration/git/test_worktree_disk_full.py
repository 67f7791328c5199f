"""A full disk when a run starts in its conversation's worktrees (pyfakefs, fake git)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pyfakefs.fake_filesystem import FakeFilesystem

from herdsman.config import Repo
from herdsman.runtime.git import FakeGit
from herdsman.runtime.worktrees.manager import METADATA, WorktreeManager

FILES = {"README.md": "hello\n"}


def manager_on(fs: FakeFilesystem, clock: list[float]) -> WorktreeManager:
    git = FakeGit()
    git.init_repository(Path("/src/app"), FILES)
    app = Repo(name="app", path=Path("/src/app"))
    return WorktreeManager(git, Path("/state/worktrees"), (app,), wall=lambda: clock[0])


def fill(fs: FakeFilesystem) -> None:
    _, used, _ = fs.get_disk_usage()
    fs.set_disk_usage(used)


async def test_a_full_disk_at_the_touch_keeps_the_conversations_worktrees(
    fs: FakeFilesystem, caplog: pytest.LogCaptureFixture
) -> None:
    clock = [1000.0]
    manager = manager_on(fs, clock)
    (first,) = await manager.prepare("default", "c")
    (first.path / "work.txt").write_text("left by run 1\n")
    fill(fs)
    clock[0] = 2000.0
    with caplog.at_level(logging.WARNING, logger="herdsman.worktrees"):
        (again,) = await manager.prepare("default", "c")
    # The touch is bookkeeping: the run still gets its checkout, as it was.
    assert (again.usable, again.path, again.error) == (True, first.path, None)
    assert (again.path / "work.txt").read_text() == "left by run 1\n"
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"could not record the last use of {first.path.parent} (")
    assert "No space left on device" in warning
    assert warning.endswith(
        "the run goes on, and retention counts the folder idle since the last use recorded before"
    )
    # The last use recorded stays the one before.
    [folder] = manager.folders()
    assert folder.last_used == 1000.0
    assert (first.path.parent / METADATA).exists()


async def test_the_touch_records_the_last_use_again_once_there_is_room(
    fs: FakeFilesystem,
) -> None:
    clock = [1000.0]
    manager = manager_on(fs, clock)
    await manager.prepare("default", "c")
    fill(fs)
    clock[0] = 2000.0
    await manager.prepare("default", "c")
    fs.set_disk_usage(1 << 40)
    clock[0] = 3000.0
    (again,) = await manager.prepare("default", "c")
    assert again.usable
    assert [f.last_used for f in manager.folders()] == [3000.0]


async def test_a_new_conversation_on_a_full_disk_gets_read_only_repos_and_no_record(
    fs: FakeFilesystem,
) -> None:
    manager = manager_on(fs, [1000.0])
    fill(fs)
    (checkout,) = await manager.prepare("default", "c")
    # The checkout itself needs room: the repo is read-only for the run, as
    # docs/worktrees.md says of any checkout that cannot be made.
    assert not checkout.usable
    assert "No space left on device" in (checkout.error or "")
    # With no record of a use, the folder is nobody's to sweep.
    assert manager.folders() == []
