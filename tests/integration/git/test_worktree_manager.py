"""The worktree manager against real git and the simulator's fake git alike."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import attrs
import trio
from git_support import FILES, World

from herdsman.config import Repo
from herdsman.runtime.git import RealGit
from herdsman.runtime.worktrees.manager import (
    METADATA,
    Checkout,
    WorktreeManager,
    checkouts_preamble,
)
from herdsman.runtime.worktrees.slug import conversation_slug


async def test_a_conversation_gets_its_own_worktree_of_every_repo(world: World) -> None:
    checkouts = await world.manager().prepare("default", "c1")
    slug = conversation_slug("default", "c1")
    assert [(c.repo.name, c.path, c.branch, c.error) for c in checkouts] == [
        ("app", world.root / slug / "app", f"herdsman/{slug}", None),
        ("lib", world.root / slug / "lib", f"herdsman/{slug}", None),
    ]
    assert (checkouts[0].path / "src" / "app.py").read_text() == "print('app')\n"
    entries = await world.git.list_worktrees(world.app.path)
    assert [(e.path, e.branch) for e in entries] == [(checkouts[0].path, f"herdsman/{slug}")]


async def test_the_next_run_finds_what_the_previous_one_left(world: World) -> None:
    manager = world.manager()
    (first, _) = await manager.prepare("default", "c1")
    (first.path / "README.md").write_text("edited by run 1\n")
    (first.path / "notes.txt").write_text("scratch\n")
    (again, _) = await manager.prepare("default", "c1")
    assert again.path == first.path
    assert (again.path / "README.md").read_text() == "edited by run 1\n"
    assert (again.path / "notes.txt").exists()
    # The original is never touched.
    assert (world.app.path / "README.md").read_text() == "hello\n"
    assert not (world.app.path / "notes.txt").exists()


async def test_conversations_and_workspaces_are_separate(world: World) -> None:
    manager = world.manager(world.app)
    (a,) = await manager.prepare("default", "c1")
    (b,) = await manager.prepare("default", "c2")
    (c,) = await manager.prepare("other", "c1")
    assert len({a.path, b.path, c.path}) == 3
    (a.path / "README.md").write_text("mine\n")
    assert (b.path / "README.md").read_text() == "hello\n"
    assert (c.path / "README.md").read_text() == "hello\n"


async def test_ten_conversations_at_once_in_one_repo_all_get_a_worktree(world: World) -> None:
    manager = world.manager(world.app)
    results: dict[str, list[Checkout]] = {}

    async def one(n: int) -> None:
        results[f"c{n}"] = await manager.prepare("default", f"c{n}")

    async with trio.open_nursery() as nursery:
        for n in range(10):
            nursery.start_soon(one, n)
    assert all(checkouts[0].usable for checkouts in results.values()), results
    assert len(await world.git.list_worktrees(world.app.path)) == 10


async def test_a_worktree_deleted_by_hand_is_made_again(world: World) -> None:
    manager = world.manager(world.app)
    (first,) = await manager.prepare("default", "c1")
    _delete_tree(first.path)
    (again,) = await manager.prepare("default", "c1")
    assert again.usable, again.error
    assert (again.path / "README.md").read_text() == "hello\n"


async def test_a_swept_conversation_comes_back_on_its_branch(world: World) -> None:
    manager = world.manager(world.app)
    (first,) = await manager.prepare("default", "c1")
    await world.git.remove_worktree(world.app.path, first.path)
    assert await world.git.branch_exists(world.app.path, first.branch)
    (again,) = await manager.prepare("default", "c1")
    assert again.usable, again.error
    assert again.branch == first.branch


async def test_a_repo_that_cannot_be_checked_out_does_not_stop_the_others(
    world: World,
) -> None:
    broken = Repo(name="gone", path=world.root.parent / "not-a-repo")
    broken.path.mkdir(parents=True)
    manager = world.manager(world.app, broken)
    app, gone = await manager.prepare("default", "c1")
    assert app.usable
    assert not gone.usable
    assert gone.error
    preamble = checkouts_preamble([app, gone])
    assert f"- {app.path} (branch {app.branch}) replaces {world.app.path}" in preamble
    assert "Never switch branches, commit or edit files in the original" in preamble
    assert f"- {broken.path} could not be checked out for you (" in preamble
    assert "treat it as read-only for this run." in preamble


async def test_metadata_names_the_conversation_and_its_last_run(world: World) -> None:
    manager = world.manager(world.app)
    await manager.prepare("default", "slack/C1/123")
    world.clock[0] = 2000.0
    await manager.prepare("ws", "c2")
    await manager.prepare("default", "slack/C1/123")
    folders = {(f.workspace, f.conversation): f.last_used for f in manager.folders()}
    assert folders == {("default", "slack/C1/123"): 2000.0, ("ws", "c2"): 2000.0}
    assert all((f.path / METADATA).exists() for f in manager.folders())


def _delete_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_dir() and not child.is_symlink():
            child.rmdir()
        else:
            child.unlink()
    path.rmdir()


async def test_a_replaced_repository_is_never_reused_blindly(world: World) -> None:
    manager = world.manager(world.app)
    (first,) = await manager.prepare("default", "a")
    # The source repository is deleted and made again at the same path.
    _delete_tree(world.app.path)
    world.make(world.app.path, FILES)
    (again,) = await manager.prepare("default", "a")
    assert not again.usable
    assert "is not registered" in (again.error or "")
    assert (first.path / "README.md").exists()  # left exactly as it was


async def test_repairing_a_deleted_folder_leaves_the_users_own_worktrees_alone(
    world: World,
) -> None:
    manager = world.manager(world.app)
    head = await world.git.head(world.app.path)
    users = world.root.parent / "users-worktree"
    await world.git.add_worktree(world.app.path, users, branch=None, commit=head)
    users.rename(users.with_name("unmounted"))  # the user's disk is away for now
    (ours,) = await manager.prepare("default", "c")
    _delete_tree(ours.path)
    (again,) = await manager.prepare("default", "c")
    assert again.usable, again.error
    listed = {e.path for e in await world.git.list_worktrees(world.app.path)}
    assert users in listed  # still registered: not pruned behind the user's back


async def test_a_folder_that_cannot_be_made_leaves_every_repo_read_only(world: World) -> None:
    world.root.parent.mkdir(parents=True, exist_ok=True)
    world.root.write_text("a file where the worktrees folder should be")
    checkouts = await world.manager().prepare("default", "c")
    assert [c.usable for c in checkouts] == [False, False]
    assert all(c.error for c in checkouts)


async def test_a_last_use_that_cannot_be_recorded_leaves_no_temporary_file(
    world: World,
) -> None:
    manager = world.manager(world.app)
    (first,) = await manager.prepare("default", "c")
    record = first.path.parent / METADATA
    record.unlink()
    (record / "in-the-way").mkdir(parents=True)  # the rename over it fails
    (again,) = await manager.prepare("default", "c")
    assert again.usable, again.error
    assert sorted(p.name for p in first.path.parent.iterdir()) == [METADATA, "app"]


async def test_a_moved_state_dir_gets_its_checkouts_back(world: World) -> None:
    manager = world.manager(world.app)
    (first,) = await manager.prepare("default", "c")
    moved_root = world.root.with_name("moved-worktrees")
    world.root.rename(moved_root)  # the state directory was moved elsewhere
    moved = attrs.evolve(world, root=moved_root).manager(world.app)
    _delete_tree(moved.folder("default", "c") / "app")  # and a checkout deleted by hand
    (again,) = await moved.prepare("default", "c")
    assert again.usable, again.error
    assert again.path == moved_root / first.path.parent.name / "app"
    assert again.branch == first.branch


async def test_a_copied_worktree_folder_is_not_reused_as_the_conversations(world: World) -> None:
    manager = world.manager(world.app)
    (first,) = await manager.prepare("default", "c1")
    # The state folder copied elsewhere (a backup restored next to it, say):
    # the copy's checkout shares the original's registration, index and HEAD.
    other_root = world.root.parent / "copied"
    shutil.copytree(world.root, other_root, symlinks=True)
    copied = WorktreeManager(world.git, other_root, (world.app,), wall=lambda: world.clock[0])
    (again,) = await copied.prepare("default", "c1")
    assert again.error is not None
    assert "is not registered in" in again.error
    (still,) = await manager.prepare("default", "c1")
    assert (still.path, still.error) == (first.path, None)


async def test_worktrees_of_a_repository_with_a_separate_git_dir_are_reused(
    tmp_path: Path,
) -> None:
    # Real git only: the fake does not model --separate-git-dir.
    base = tmp_path.resolve()
    source, git_dir = base / "src" / "app", base / "elsewhere" / "app.git"
    source.mkdir(parents=True)
    git_dir.parent.mkdir()
    (source / "README.md").write_text("hello\n")

    def run(*args: str) -> None:
        subprocess.run(["git", "-C", str(source), *args], check=True, capture_output=True)

    run("init", "-q", "-b", "main", f"--separate-git-dir={git_dir}")
    run("add", "-A")
    identity = ("-c", "user.name=t", "-c", "user.email=t@t.invalid", "-c", "commit.gpgsign=false")
    run(*identity, "commit", "-q", "-m", "one")
    app = Repo(name="app", path=source)
    manager = WorktreeManager(RealGit(), base / "state", (app,), wall=lambda: 1000.0)
    (first,) = await manager.prepare("default", "c1")
    assert first.error is None
    (again,) = await manager.prepare("default", "c1")
    assert (again.path, again.error) == (first.path, None)
