"""No worktree is made, used, listed or removed through a symbolic link (real git and fake).

An agent runs as the supervisor's user and can replace anything under the
state directory: its checkout by a link to the user's own worktree (then
swept, git would remove the user's worktree), or a conversation's folder by
a link to anywhere (then the next run would make its checkout there).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from git_support import World

from herdsman.runtime.worktrees.listing import describe_worktrees
from herdsman.runtime.worktrees.manager import METADATA, WorktreeManager
from herdsman.runtime.worktrees.slug import conversation_slug
from herdsman.runtime.worktrees.sweeper import sweep

DAY = 86_400.0


def never_busy(_workspace: str, _conversation: str) -> bool:
    return False


async def swapped(world: World) -> tuple[WorktreeManager, Path, Path]:
    """A conversation whose checkout of app an agent replaced by a link to the user's
    own worktree of app (clean, on their branch, outside the state dir): the manager,
    the checkout's path and the user's worktree."""
    manager = world.manager(world.app)
    (checkout,) = await manager.prepare("default", "conv1")
    user = world.root.parent.parent / "userwt"
    # Clean, as a user's worktree whose work is committed is: what git removes.
    await world.git.add_worktree(world.app.path, user, branch="feature", commit="HEAD")
    shutil.rmtree(checkout.path)
    checkout.path.symlink_to(user)
    return manager, checkout.path, user


async def test_a_checkout_swapped_for_a_link_to_the_users_worktree_is_not_swept(
    world: World,
) -> None:
    manager, checkout, user = await swapped(world)
    world.clock[0] += 2 * DAY

    dry = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=never_busy, dry_run=True)
    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=never_busy)

    for done in (dry, report):
        [entry] = done.entries
        assert (entry.repo, entry.path, entry.action) == ("app", checkout, "refused")
        assert "is a symbolic link" in entry.detail
    assert (user / "README.md").read_text() == "hello\n"
    entries = await world.git.list_worktrees(world.app.path)
    assert user in [e.path for e in entries]  # still registered: git never touched it
    assert checkout.is_symlink()  # left as the agent left it
    assert (checkout.parent / METADATA).exists()  # so the folder stays


async def test_a_run_refuses_a_checkout_swapped_for_a_link(world: World) -> None:
    manager, _, _ = await swapped(world)
    (again,) = await manager.prepare("default", "conv1")
    assert not again.usable
    assert "is a symbolic link" in (again.error or "")


async def test_a_link_at_a_missing_checkout_is_not_followed_to_make_one(world: World) -> None:
    manager = world.manager(world.app)
    outside = world.root.parent.parent / "outside"
    outside.mkdir()
    folder = world.root / conversation_slug("default", "conv1")
    folder.mkdir(parents=True)
    (folder / "app").symlink_to(outside)  # git would make the worktree in there
    (checkout,) = await manager.prepare("default", "conv1")
    assert not checkout.usable
    assert list(outside.iterdir()) == []
    assert await world.git.list_worktrees(world.app.path) == []


async def test_a_link_planted_at_a_conversations_folder_is_never_followed(
    world: World,
) -> None:
    manager = world.manager()
    outside = world.root.parent.parent / "outside"
    outside.mkdir()
    world.root.mkdir(parents=True)
    folder = world.root / conversation_slug("default", "conv1")
    folder.symlink_to(outside)

    checkouts = await manager.prepare("default", "conv1")

    assert [c.usable for c in checkouts] == [False, False]
    assert all("is a symbolic link" in (c.error or "") for c in checkouts)
    assert list(outside.iterdir()) == []  # no checkout, no metadata out there
    assert await world.git.list_worktrees(world.app.path) == []
    # Someone's folder with metadata behind the link is still not ours.
    (outside / METADATA).write_text(
        '{"workspace": "default", "conversation": "conv1", "last_used": 0}'
    )
    assert manager.folders() == []
    assert await describe_worktrees(manager) == []
    world.clock[0] += 2 * DAY
    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=never_busy)
    assert report.entries == ()
    assert folder.is_symlink()
    assert (outside / METADATA).exists()


async def test_a_link_at_the_worktrees_root_is_never_followed(world: World) -> None:
    manager = world.manager(world.app)
    outside = world.root.parent.parent / "outside"
    outside.mkdir()
    world.root.parent.mkdir(parents=True)
    world.root.symlink_to(outside)
    (checkout,) = await manager.prepare("default", "conv1")
    assert not checkout.usable
    assert list(outside.iterdir()) == []
    assert manager.folders() == []


async def test_a_link_at_the_metadata_files_is_replaced_not_written_through(
    world: World,
) -> None:
    manager = world.manager(world.app)
    (checkout,) = await manager.prepare("default", "conv1")
    victim = world.root.parent.parent / "victim.txt"
    victim.write_text("precious\n")
    folder = checkout.path.parent
    (folder / METADATA).unlink()
    (folder / METADATA).symlink_to(victim)
    (folder / f"{METADATA}.tmp").symlink_to(victim)
    world.clock[0] += 10.0
    await manager.prepare("default", "conv1")
    assert victim.read_text() == "precious\n"
    assert not (folder / METADATA).is_symlink()
    assert [f.last_used for f in manager.folders()] == [world.clock[0]]


async def test_a_swapped_checkout_is_listed_as_refused_and_not_measured(world: World) -> None:
    manager, checkout, _ = await swapped(world)
    [row] = await describe_worktrees(manager)
    assert (row["path"], row["status"], row["size_bytes"]) == (
        str(checkout),
        "refused (a symbolic link)",
        0,
    )


async def test_folders_and_metadata_are_private_whatever_the_umask(world: World) -> None:
    old = os.umask(0o022)
    try:
        manager = world.manager(world.app)
        (checkout,) = await manager.prepare("default", "conv1")
    finally:
        os.umask(old)
    for path in (world.root, checkout.path.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert stat.S_IMODE((checkout.path.parent / METADATA).stat().st_mode) == 0o600


async def test_git_follows_a_link_which_is_why_the_sweep_checks_first(world: World) -> None:
    # The danger the check guards against, and that the fake git models it
    # as real git does: a removal through a link removes what it points at.
    _, checkout, user = await swapped(world)
    await world.git.remove_worktree(world.app.path, checkout)
    assert not user.exists()
