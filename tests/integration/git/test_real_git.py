"""RealGit-only behaviour: per-repository serialisation, environment isolation, parsing.

Parallel ``git worktree add`` in one repository did not fail reliably on this
machine (40 parallel adds with one basename succeeded every time with git
2.39), so serialisation is proved by observation instead: a wrapper around
git logs when each command starts and ends, and the log shows that commands
in one repository never overlap while commands in two repositories do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import trio

from herdsman.runtime.git import GitError, RealGit, WorktreeState


def git_init(path: Path, files: dict[str, str]) -> str:
    """A real repository with one commit of ``files``; return HEAD."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)

    def run(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(path), *args], check=True, capture_output=True, text=True
        )
        return done.stdout.strip()

    run("init", "-q", "-b", "main")
    run("config", "user.name", "herdsman tests")
    run("config", "user.email", "tests@herdsman.invalid")
    run("add", "-A")
    run("-c", "commit.gpgsign=false", "commit", "-q", "-m", "initial")
    return run("rev-parse", "HEAD")


def logging_git(tmp_path: Path, log: Path) -> str:
    """A git wrapper that logs start/end of every `worktree` command, slowed down."""
    real = shutil.which("git")
    assert real is not None
    wrapper = tmp_path / "git-wrapper"
    wrapper.write_text(
        "#!/bin/sh\n"
        # argv: -c core.hooksPath=/dev/null -C REPO worktree ...
        'if [ "$5" = worktree ] && [ "$6" != list ]; then\n'
        f'  echo "start $4" >> {log}\n'
        "  sleep 0.2\n"
        f'  {real} "$@"; rc=$?\n'
        f'  echo "end $4" >> {log}\n'
        "  exit $rc\n"
        "fi\n"
        f'exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


async def test_one_repository_serialised_two_repositories_in_parallel(tmp_path: Path) -> None:
    base = tmp_path.resolve()
    log = base / "git.log"
    git = RealGit(git=logging_git(base, log))
    app, lib = base / "app", base / "lib"
    heads = {app: git_init(app, {"a.txt": "a\n"}), lib: git_init(lib, {"l.txt": "l\n"})}

    async def add(repo: Path, name: str) -> None:
        path = base / "state" / name / repo.name
        await git.add_worktree(repo, path, branch=None, commit=heads[repo])

    async with trio.open_nursery() as nursery:
        for name in ("c1", "c2", "c3"):
            nursery.start_soon(add, app, name)
        nursery.start_soon(add, lib, "c1")
    lines = log.read_text().splitlines()
    assert len(lines) == 8

    app_lines = [line.split()[0] for line in lines if line.endswith(str(app))]
    assert app_lines == ["start", "end"] * 3  # never two at once in one repository
    # ...but lib's add ran while one of app's was running: some app command
    # started before lib's ended and ended after lib's started.
    lib_start = lines.index(f"start {lib}")
    lib_end = lines.index(f"end {lib}")
    open_app = 0
    overlapped = False
    for index, line in enumerate(lines):
        if line.endswith(str(app)):
            open_app += 1 if line.startswith("start") else -1
        if lib_start <= index <= lib_end and open_app:
            overlapped = True
    assert overlapped, lines
    assert len(await git.list_worktrees(app)) == 3


async def test_repository_variables_in_the_environment_are_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path.resolve()
    app_head = git_init(base / "app", {"a.txt": "a\n"})
    git_init(base / "other", {"o.txt": "o\n"})
    # As if the supervisor had been started from a git hook of another repo.
    monkeypatch.setenv("GIT_DIR", str(base / "other" / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(base / "other"))
    git = RealGit()
    assert await git.head(base / "app") == app_head
    assert await git.worktree_status(base / "app") == WorktreeState(exists=True, clean=True)


async def test_missing_git_binary_is_a_git_error(tmp_path: Path) -> None:
    git = RealGit(git=str(tmp_path / "no-such-git"))
    with pytest.raises(GitError, match="cannot run"):
        await git.head(tmp_path)


async def test_staged_rename_and_odd_names_are_parsed(tmp_path: Path) -> None:
    base = tmp_path.resolve()
    head = git_init(base / "app", {"old name.txt": "x\n", "keep.txt": "k\n"})
    git = RealGit()
    worktree = base / "state" / "c1" / "app"
    await git.add_worktree(base / "app", worktree, branch=None, commit=head)
    subprocess.run(
        ["git", "-C", str(worktree), "mv", "old name.txt", "new\tname.txt"],
        check=True,
        capture_output=True,
    )
    (worktree / "ünïcode.txt").write_text("u\n")
    state = await git.worktree_status(worktree)
    # -z output: no quoting of tabs or non-ASCII; a rename's source path is
    # consumed, not mistaken for an entry of its own.
    assert state == WorktreeState(
        exists=True, clean=False, modified=("new\tname.txt",), untracked=("ünïcode.txt",)
    )
    assert os.fsencode(state.untracked[0]) == "ünïcode.txt".encode()


async def test_hooks_of_the_repository_never_run(tmp_path: Path) -> None:
    base = tmp_path.resolve()
    repo = base / "app"
    head = git_init(repo, {"a.txt": "a\n"})
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {base / 'hook-ran'}\nsleep 100\n")
    hook.chmod(0o755)
    git = RealGit()
    with trio.fail_after(20):
        await git.add_worktree(repo, base / "state" / "c1" / "app", branch="b1", commit=head)
    assert not (base / "hook-ran").exists()
