"""The git port contract, run against RealGit (real git, real disk) and FakeGit (pyfakefs).

Passing the same suite is what says the simulator's fake behaves like git for
everything the worktree manager and the retention sweeper rely on. When the
two disagree, the fake is fixed, never the test.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import attrs
import pytest
import trio
from git_support import MakeRepo, implementation

from herdsman.runtime.git import (
    MISSING,
    Git,
    GitError,
    NotARepository,
    WorktreeDirty,
    WorktreeEntry,
    WorktreeExists,
    WorktreeHead,
    WorktreeState,
)

FILES = {
    "README.md": "hello\n",
    "src/app.py": "print('hi')\n",
    ".gitignore": "*.log\nbuild/\n/top.tmp\n",
}
CLEAN = WorktreeState(exists=True, clean=True)


@attrs.frozen
class Setup:
    """One implementation with a repository (``FILES``) and a place for worktrees."""

    git: Git
    repo: Path
    state: Path  # where worktrees go; does not exist yet
    plain: Path  # an existing directory that is no repository
    make_repo: MakeRepo


@pytest.fixture(params=["real", "fake"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Setup:
    git, base, make_repo = implementation(request, tmp_path)
    repo = base / "repos" / "app"
    make_repo(repo, FILES)
    plain = base / "plain"
    plain.mkdir(parents=True)
    (plain / "file.txt").write_text("not a repo\n")
    return Setup(git=git, repo=repo, state=base / "state", plain=plain, make_repo=make_repo)


def write(root: Path, name: str, text: str) -> None:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_bytes(text.encode())


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` except git's own ``.git``, by relative path."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".git" not in path.relative_to(root).parts
    }


async def add(s: Setup, name: str, *, branch: str | None = None) -> Path:
    """A worktree of ``s.repo`` at ``<state>/<name>/app`` (the manager's layout)."""
    path = s.state / name / "app"
    await s.git.add_worktree(s.repo, path, branch=branch, commit=await s.git.head(s.repo))
    return path


async def test_is_repository(setup: Setup) -> None:
    git = setup.git
    assert await git.is_repository(setup.repo)
    assert not await git.is_repository(setup.plain)
    assert not await git.is_repository(setup.state / "missing")
    # A subdirectory is not a repository, though plain `git -C` would search upwards.
    assert not await git.is_repository(setup.repo / "src")
    worktree = await add(setup, "c1")
    assert await git.is_repository(worktree)


async def test_head_is_a_stable_commit_id(setup: Setup) -> None:
    head = await setup.git.head(setup.repo)
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    assert await setup.git.head(setup.repo) == head


async def test_add_detached_checks_out_the_commit(setup: Setup) -> None:
    git, head = setup.git, await setup.git.head(setup.repo)
    worktree = await add(setup, "c1")
    assert snapshot(worktree) == snapshot(setup.repo) == {k: v.encode() for k, v in FILES.items()}
    assert await git.head(worktree) == head
    assert await git.list_worktrees(setup.repo) == [
        WorktreeEntry(path=worktree, head=head, branch=None, prunable=False)
    ]
    assert await git.worktree_status(worktree) == CLEAN


async def test_add_on_a_new_branch(setup: Setup) -> None:
    git, head = setup.git, await setup.git.head(setup.repo)
    worktree = await add(setup, "c1", branch="herdsman/c1")
    assert snapshot(worktree) == snapshot(setup.repo)
    assert await git.list_worktrees(setup.repo) == [
        WorktreeEntry(path=worktree, head=head, branch="herdsman/c1", prunable=False)
    ]
    # The branch exists now; a second worktree cannot create it again.
    with pytest.raises(GitError, match="already exists") as caught:
        await add(setup, "c2", branch="herdsman/c1")
    assert not isinstance(caught.value, WorktreeExists)
    assert not (setup.state / "c2").exists()


async def test_an_existing_branch_gets_a_worktree_again(setup: Setup) -> None:
    git, head = setup.git, await setup.git.head(setup.repo)
    assert not await git.branch_exists(setup.repo, "herdsman/c1")
    first = await add(setup, "c1", branch="herdsman/c1")
    assert await git.branch_exists(setup.repo, "herdsman/c1")
    # Checked out in c1 already: git refuses a second worktree on it.
    with pytest.raises(GitError, match="already checked out"):
        await git.add_worktree_on(setup.repo, setup.state / "c2" / "app", branch="herdsman/c1")
    await git.remove_worktree(setup.repo, first)
    assert await git.branch_exists(setup.repo, "herdsman/c1")  # removal keeps the branch
    again = setup.state / "c1" / "app"
    await git.add_worktree_on(setup.repo, again, branch="herdsman/c1")
    assert snapshot(again) == snapshot(setup.repo)
    assert await git.list_worktrees(setup.repo) == [
        WorktreeEntry(path=again, head=head, branch="herdsman/c1", prunable=False)
    ]
    with pytest.raises(GitError):
        await git.add_worktree_on(setup.repo, setup.state / "c3" / "app", branch="nope")


async def test_add_by_branch_name_and_bad_commit(setup: Setup) -> None:
    git, head = setup.git, await setup.git.head(setup.repo)
    path = setup.state / "c1" / "app"
    await git.add_worktree(setup.repo, path, branch=None, commit="main")
    assert await git.head(path) == head
    missing = setup.state / "c2" / "app"
    with pytest.raises(GitError, match="invalid reference: no-such-ref") as caught:
        await git.add_worktree(setup.repo, missing, branch=None, commit="no-such-ref")
    assert "worktree add" in str(caught.value)
    assert not missing.exists()


async def test_status_clean_modified_untracked_clean(setup: Setup) -> None:
    git = setup.git
    worktree = await add(setup, "c1")
    assert await git.worktree_status(worktree) == CLEAN

    write(worktree, "README.md", "changed\n")
    assert await git.worktree_status(worktree) == WorktreeState(
        exists=True, clean=False, modified=("README.md",)
    )
    write(worktree, "notes.txt", "new\n")
    write(worktree, "new/deep/file.txt", "new\n")  # listed per file, not as "new/"
    (worktree / "src" / "app.py").unlink()
    assert await git.worktree_status(worktree) == WorktreeState(
        exists=True,
        clean=False,
        modified=("README.md", "src/app.py"),
        untracked=("new/deep/file.txt", "notes.txt"),
    )

    write(worktree, "README.md", FILES["README.md"])
    write(worktree, "src/app.py", FILES["src/app.py"])
    (worktree / "notes.txt").unlink()
    assert await git.worktree_status(worktree) == WorktreeState(
        exists=True, clean=False, untracked=("new/deep/file.txt",)
    )
    shutil.rmtree(worktree / "new")
    assert await git.worktree_status(worktree) == CLEAN


async def test_ignored_files_leave_it_clean_and_are_removed_with_it(setup: Setup) -> None:
    git = setup.git
    worktree = await add(setup, "c1")
    write(worktree, "debug.log", "x\n")
    write(worktree, "src/deep/trace.log", "x\n")
    write(worktree, "build/out/app.bin", "x\n")
    write(worktree, "top.tmp", "x\n")  # anchored pattern: ignored at the top only
    assert await git.worktree_status(worktree) == CLEAN
    write(worktree, "src/top.tmp", "x\n")
    assert (await git.worktree_status(worktree)).untracked == ("src/top.tmp",)
    (worktree / "src" / "top.tmp").unlink()
    await git.remove_worktree(setup.repo, worktree)
    assert not worktree.exists()


async def test_source_repository_is_untouched(setup: Setup) -> None:
    git = setup.git
    before = snapshot(setup.repo)
    worktree = await add(setup, "c1", branch="c1")
    write(worktree, "README.md", "changed\n")
    write(worktree, "notes.txt", "new\n")
    (worktree / "src" / "app.py").unlink()
    assert snapshot(setup.repo) == before
    assert await git.worktree_status(setup.repo) == CLEAN


async def test_remove_refuses_dirty_and_removes_clean(setup: Setup) -> None:
    git = setup.git
    worktree = await add(setup, "c1")

    write(worktree, "README.md", "work in progress\n")
    with pytest.raises(WorktreeDirty) as caught:
        await git.remove_worktree(setup.repo, worktree)
    assert caught.value.modified == ("README.md",)
    assert caught.value.untracked == ()
    assert caught.value.path == worktree
    assert "README.md" in str(caught.value)
    assert "worktree remove" in str(caught.value)
    assert "contains modified or untracked files" in str(caught.value)
    assert (worktree / "README.md").read_text() == "work in progress\n"

    write(worktree, "README.md", FILES["README.md"])
    write(worktree, "notes.txt", "keep me\n")
    with pytest.raises(WorktreeDirty) as caught:
        await git.remove_worktree(setup.repo, worktree)
    assert (caught.value.modified, caught.value.untracked) == ((), ("notes.txt",))
    assert "notes.txt" in str(caught.value)
    assert (worktree / "notes.txt").exists()

    (worktree / "notes.txt").unlink()
    await git.remove_worktree(setup.repo, worktree)
    assert not worktree.exists()
    assert worktree.parent.is_dir()  # only the worktree goes, not the conversation dir
    assert await git.list_worktrees(setup.repo) == []
    assert await git.worktree_status(worktree) == MISSING


async def test_remove_refuses_what_is_not_a_linked_worktree(setup: Setup) -> None:
    git = setup.git
    with pytest.raises(GitError, match="is a main working tree"):
        await git.remove_worktree(setup.repo, setup.repo)
    with pytest.raises(GitError, match="is not a working tree"):
        await git.remove_worktree(setup.repo, setup.plain)
    assert (setup.plain / "file.txt").exists()
    assert snapshot(setup.repo) == {k: v.encode() for k, v in FILES.items()}


async def test_add_at_an_occupied_path(setup: Setup) -> None:
    git = setup.git
    head = await git.head(setup.repo)
    worktree = await add(setup, "c1")
    with pytest.raises(WorktreeExists, match="already exists") as caught:
        await add(setup, "c1")
    assert caught.value.path == worktree
    # With a branch too, and the refused add leaves no branch behind.
    with pytest.raises(WorktreeExists):
        await git.add_worktree(setup.repo, setup.plain, branch="b1", commit=head)
    assert (setup.plain / "file.txt").read_text() == "not a repo\n"
    await add(setup, "c2", branch="b1")
    # An existing empty directory is fine, as with git.
    empty = setup.state / "c3" / "app"
    empty.mkdir(parents=True)
    await git.add_worktree(setup.repo, empty, branch=None, commit=head)
    assert [entry.path for entry in await git.list_worktrees(setup.repo)] == [
        worktree,
        setup.state / "c2" / "app",
        empty,
    ]


async def test_stale_registration_is_pruned_and_recreated(setup: Setup) -> None:
    git = setup.git
    head = await git.head(setup.repo)
    worktree = await add(setup, "c1", branch="c1")
    kept = await add(setup, "c2")
    shutil.rmtree(worktree)  # deleted by hand

    assert await git.worktree_status(worktree) == MISSING
    entries = await git.list_worktrees(setup.repo)
    assert [(entry.path, entry.prunable) for entry in entries] == [
        (worktree, True),
        (kept, False),
    ]
    with pytest.raises(WorktreeExists, match="missing but already registered"):
        await git.add_worktree(setup.repo, worktree, branch=None, commit=head)

    await git.prune(setup.repo)
    assert [entry.path for entry in await git.list_worktrees(setup.repo)] == [kept]
    await git.add_worktree(setup.repo, worktree, branch=None, commit=head)
    assert await git.worktree_status(worktree) == CLEAN
    assert await git.worktree_status(kept) == CLEAN


async def test_removing_a_vanished_worktree_drops_its_registration(setup: Setup) -> None:
    worktree = await add(setup, "c1")
    shutil.rmtree(worktree)
    await setup.git.remove_worktree(setup.repo, worktree)
    assert await setup.git.list_worktrees(setup.repo) == []


async def test_not_a_repository(setup: Setup) -> None:
    git, plain = setup.git, setup.plain
    head = await git.head(setup.repo)
    with pytest.raises(NotARepository) as caught:
        await git.head(plain)
    assert caught.value.path == plain
    assert "not a git repository" in str(caught.value)
    with pytest.raises(NotARepository):
        await git.head(setup.repo / "src")
    with pytest.raises(NotARepository, match="cannot change to"):
        await git.head(setup.state / "missing")
    with pytest.raises(NotARepository):
        await git.add_worktree(plain, setup.state / "c1" / "app", branch=None, commit=head)
    assert not setup.state.exists()
    with pytest.raises(NotARepository):
        await git.list_worktrees(plain)
    with pytest.raises(NotARepository):
        await git.prune(plain)
    with pytest.raises(NotARepository):
        await git.remove_worktree(plain, plain)
    with pytest.raises(NotARepository):
        await git.worktree_status(plain)


async def test_worktree_head_names_the_repository_and_the_branch(setup: Setup) -> None:
    git, repo = setup.git, setup.repo
    detached, on_branch = await add(setup, "c1"), await add(setup, "c2", branch="herdsman/c2")
    git_dir = repo / ".git"
    assert await git.worktree_head(repo) == WorktreeHead(git_dir=git_dir, branch="main")
    assert await git.worktree_head(detached) == WorktreeHead(git_dir=git_dir, branch=None)
    assert await git.worktree_head(on_branch) == WorktreeHead(git_dir=git_dir, branch="herdsman/c2")
    for not_a_top in (on_branch / "src", setup.plain, setup.state / "missing"):
        with pytest.raises(NotARepository):
            await git.worktree_head(not_a_top)
    # A copy of a worktree is not that worktree: its registration names the original.
    copy = setup.state / "copied" / "app"
    shutil.copytree(on_branch, copy, symlinks=True)
    with pytest.raises(NotARepository):
        await git.worktree_head(copy)
    # The source lost the registration (re-cloned, say): no longer its worktree.
    shutil.rmtree(repo / ".git" / "worktrees")
    with pytest.raises(NotARepository):
        await git.worktree_head(on_branch)


async def test_two_worktrees_are_independent(setup: Setup) -> None:
    git = setup.git
    first, second = await add(setup, "c1"), await add(setup, "c2", branch="c2")
    write(first, "README.md", "edited in c1\n")
    write(first, "only-in-c1.txt", "x\n")
    assert (second / "README.md").read_text() == "hello\n"
    assert not (second / "only-in-c1.txt").exists()
    assert await git.worktree_status(second) == CLEAN
    assert (await git.worktree_status(first)).modified == ("README.md",)
    write(first, "README.md", FILES["README.md"])
    (first / "only-in-c1.txt").unlink()
    await git.remove_worktree(setup.repo, first)
    assert snapshot(second) == snapshot(setup.repo)
    assert [entry.path for entry in await git.list_worktrees(setup.repo)] == [second]


async def test_concurrent_adds_in_one_repository(setup: Setup) -> None:
    # The manager's layout gives every worktree of a repo the same basename,
    # so git must number its registrations; the per-repo lock keeps that sane.
    git = setup.git
    head = await git.head(setup.repo)
    paths = [setup.state / f"c{index:02}" / "app" for index in range(10)]
    async with trio.open_nursery() as nursery:
        for path in paths:
            nursery.start_soon(
                lambda p: git.add_worktree(setup.repo, p, branch=f"b-{p.parent.name}", commit=head),
                path,
            )
    entries = await git.list_worktrees(setup.repo)
    assert [(entry.path, entry.branch) for entry in entries] == [
        (path, f"b-{path.parent.name}") for path in paths
    ]
    for path in paths:
        assert await git.worktree_status(path) == CLEAN


async def test_repositories_are_separate(setup: Setup) -> None:
    git = setup.git
    other = setup.repo.parent / "lib"
    setup.make_repo(other, {"lib.txt": "library\n"})
    other_head = await git.head(other)
    assert other_head != await git.head(setup.repo)
    mine = await add(setup, "c1")
    theirs = setup.state / "c1" / "lib"
    await git.add_worktree(other, theirs, branch=None, commit=other_head)
    assert snapshot(theirs) == {"lib.txt": b"library\n"}
    assert [entry.path for entry in await git.list_worktrees(setup.repo)] == [mine]
    assert [entry.path for entry in await git.list_worktrees(other)] == [theirs]
    with pytest.raises(GitError, match="is not a working tree"):
        await git.remove_worktree(setup.repo, theirs)
    await git.remove_worktree(other, theirs)
    assert mine.is_dir()
