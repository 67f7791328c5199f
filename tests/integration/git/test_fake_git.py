"""FakeGit-only behaviour: failure injection, deterministic ids, never spawning."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest
import trio
import trio.testing
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.runtime.git import FakeGit, GitError, WorktreeState

FILES = {"README.md": "hello\n", "src/app.py": "print('hi')\n"}
REPO = Path("/sim/repos/app")


async def test_injected_failure_fails_the_next_call_only(fs: Patcher) -> None:
    git = FakeGit()
    head = git.init_repository(REPO, FILES)
    worktree = Path("/sim/state/c1/app")
    disk_full = GitError(["git", "worktree", "add"], "fatal: No space left on device")
    git.inject_failure("add_worktree", disk_full)
    with pytest.raises(GitError, match="No space left on device") as caught:
        await git.add_worktree(REPO, worktree, branch="c1", commit=head)
    assert caught.value is disk_full
    assert not worktree.exists()
    assert await git.list_worktrees(REPO) == []
    # Nothing half-done: the same add, branch included, now succeeds.
    await git.add_worktree(REPO, worktree, branch="c1", commit=head)
    assert await git.worktree_status(worktree) == WorktreeState(exists=True, clean=True)


async def test_latency_delays_each_call_before_it_acts(
    fs: Patcher, autojump_clock: trio.testing.MockClock
) -> None:
    asked: list[str] = []

    def latency(operation: str) -> float:
        asked.append(operation)
        return 2.5

    git = FakeGit(latency=latency)
    head = git.init_repository(REPO, FILES)
    worktree = Path("/sim/state/c1/app")
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: git.add_worktree(REPO, worktree, branch="c1", commit=head))
        await trio.sleep(2.0)
        assert not worktree.exists()  # still "running"
    assert trio.current_time() - began == 2.5
    assert worktree.exists()
    assert asked == ["add_worktree"]


async def test_injected_failures_queue_per_operation(fs: Patcher) -> None:
    git = FakeGit()
    git.init_repository(REPO, FILES)
    git.inject_failure("head", GitError(["git", "rev-parse"], "fatal: first"))
    git.inject_failure("head", GitError(["git", "rev-parse"], "fatal: second"))
    git.inject_failure("prune", GitError(["git", "worktree", "prune"], "fatal: prune"))
    with pytest.raises(GitError, match="first"):
        await git.head(REPO)
    assert await git.list_worktrees(REPO) == []  # other operations are unaffected
    with pytest.raises(GitError, match="second"):
        await git.head(REPO)
    assert len(await git.head(REPO)) == 40
    with pytest.raises(GitError, match="prune"):
        await git.prune(REPO)
    with pytest.raises(ValueError, match="unknown git operation"):
        git.inject_failure("commit", GitError(["git"], ""))  # type: ignore[arg-type]


async def test_commit_ids_are_deterministic(fs: Patcher) -> None:
    first = FakeGit().init_repository(Path("/sim/a"), FILES)
    again = FakeGit().init_repository(Path("/sim/b"), dict(reversed(FILES.items())))
    other = FakeGit().init_repository(Path("/sim/c"), {"README.md": "other\n"})
    assert first == again != other
    assert re.fullmatch(r"[0-9a-f]{40}", first)


def test_init_repository_rejects_bad_names_and_reuse(fs: Patcher) -> None:
    git = FakeGit()
    with pytest.raises(ValueError, match="not a repository-relative"):
        git.init_repository(Path("/sim/a"), {"../escape.txt": "x"})
    with pytest.raises(ValueError, match="not a repository-relative"):
        git.init_repository(Path("/sim/a"), {".git/config": "x"})
    git.init_repository(Path("/sim/b"), FILES)
    with pytest.raises(FileExistsError):
        git.init_repository(Path("/sim/b"), FILES)


async def test_never_spawns_and_never_touches_the_real_disk(
    fs: Patcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[str] = []

    def refuse(name: str) -> Any:
        def spawn(*args: object, **kwargs: object) -> NoReturn:
            spawned.append(name)
            raise AssertionError(f"FakeGit spawned a process via {name}")

        return spawn

    monkeypatch.setattr(subprocess, "Popen", refuse("subprocess.Popen"))
    monkeypatch.setattr(trio, "run_process", refuse("trio.run_process"))
    for name in ("fork", "posix_spawn", "posix_spawnp", "execv", "execve", "system"):
        monkeypatch.setattr(os, name, refuse(f"os.{name}"))

    git = FakeGit()
    head = git.init_repository(REPO, FILES)
    worktree = Path("/sim/state/c1/app")
    assert await git.is_repository(REPO)
    await git.add_worktree(REPO, worktree, branch="c1", commit=await git.head(REPO))
    (worktree / "notes.txt").write_text("x\n")
    assert (await git.worktree_status(worktree)).untracked == ("notes.txt",)
    (worktree / "notes.txt").unlink()
    await git.remove_worktree(REPO, worktree)
    await git.add_worktree(REPO, worktree, branch=None, commit=head)
    await git.prune(REPO)
    assert len(await git.list_worktrees(REPO)) == 1
    assert spawned == []

    fs.pause()
    try:
        assert not os.path.exists("/sim")
    finally:
        fs.resume()


async def test_the_lock_is_held_per_source_repository(fs: Patcher) -> None:
    # While one add holds app's lock, an add in lib completes and a second
    # add in app waits: observed through the order the calls finish in.
    git = FakeGit()
    app_head = git.init_repository(REPO, FILES)
    lib = Path("/sim/repos/lib")
    lib_head = git.init_repository(lib, {"l.txt": "l\n"})
    finished: list[str] = []

    async def add(repo: Path, head: str, name: str) -> None:
        await git.add_worktree(
            repo, Path("/sim/state") / name / repo.name, branch=None, commit=head
        )
        finished.append(f"{repo.name}/{name}")

    # Hold app's lock from outside (a private hook: the lock is not API).
    async with git._lock(REPO.resolve()), trio.open_nursery() as nursery:
        nursery.start_soon(add, REPO, app_head, "c1")
        nursery.start_soon(add, lib, lib_head, "c1")
        await trio.testing.wait_all_tasks_blocked()
        assert finished == ["lib/c1"]
        nursery.cancel_scope.cancel()
    assert await git.list_worktrees(REPO) == []
