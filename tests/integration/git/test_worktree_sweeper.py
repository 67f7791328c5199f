"""Retention never loses work: against real git and the fake alike."""

from __future__ import annotations

from pathlib import Path

import trio
from git_support import World

from herdsman.runtime.worktrees.sweeper import sweep

DAY = 86_400.0


def never_busy(_workspace: str, _conversation: str) -> bool:
    return False


async def test_idle_clean_worktrees_go_and_the_branch_stays(world: World) -> None:
    manager = world.manager()
    checkouts = await manager.prepare("default", "old")
    world.clock[0] += 2 * DAY
    await manager.prepare("default", "recent")
    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=never_busy)
    assert [(e.conversation, e.repo, e.action) for e in report.entries] == [
        ("old", "app", "removed"),
        ("old", "lib", "removed"),
    ]
    assert not checkouts[0].path.parent.exists()  # the conversation's folder is gone
    assert await world.git.branch_exists(world.app.path, checkouts[0].branch)
    assert [f.conversation for f in manager.folders()] == ["recent"]
    assert (world.app.path / "README.md").read_text() == "hello\n"


async def test_dirty_worktrees_are_kept_until_cleaned(world: World) -> None:
    manager = world.manager(world.app)
    (checkout,) = await manager.prepare("default", "c")
    (checkout.path / "README.md").write_text("unsaved work\n")
    world.clock[0] += 2 * DAY
    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=never_busy)
    assert [(e.action, e.detail) for e in report.entries] == [("kept-dirty", "README.md")]
    assert (checkout.path / "README.md").read_text() == "unsaved work\n"
    (checkout.path / "README.md").write_text("hello\n")
    (checkout.path / "new.txt").write_text("untracked work\n")
    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=never_busy)
    assert [(e.action, e.detail) for e in report.entries] == [("kept-dirty", "new.txt")]
    (checkout.path / "new.txt").unlink()
    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=never_busy)
    assert [e.action for e in report.entries] == ["removed"]


async def test_a_busy_conversation_is_never_swept(world: World) -> None:
    manager = world.manager()
    (app, lib) = await manager.prepare("default", "c")
    world.clock[0] += 2 * DAY
    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=lambda w, c: True)
    assert [e.action for e in report.entries] == ["busy", "busy"]
    assert app.path.exists()
    assert lib.path.exists()


async def test_a_run_arriving_mid_sweep_stops_the_sweep_of_its_conversation(
    world: World,
) -> None:
    manager = world.manager()
    (app, lib) = await manager.prepare("default", "c")
    world.clock[0] += 2 * DAY
    checks = 0

    def arrives_after_first_removal(_workspace: str, _conversation: str) -> bool:
        nonlocal checks
        checks += 1
        return checks > 2  # two checks per repo: the run arrives after app went

    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=arrives_after_first_removal)
    assert [(e.repo, e.action) for e in report.entries] == [("app", "removed"), ("lib", "busy")]
    assert lib.path.exists()
    # The run's start makes the removed checkout again, on its branch.
    (again, lib_again) = await manager.prepare("default", "c")
    assert again.usable
    assert again.path == app.path
    assert lib_again.path == lib.path


async def test_preparing_waits_for_a_sweep_of_the_same_conversation(
    world: World, nursery: trio.Nursery
) -> None:
    manager = world.manager(world.app)
    await manager.prepare("default", "c")
    done = trio.Event()

    async def prepare() -> None:
        await manager.prepare("default", "c")
        done.set()

    async with manager.lock("default", "c"):
        nursery.start_soon(prepare)
        await trio.testing.wait_all_tasks_blocked()
        assert not done.is_set()
    with trio.fail_after(10):
        await done.wait()


async def test_a_dry_run_removes_nothing(world: World) -> None:
    manager = world.manager(world.app)
    (checkout,) = await manager.prepare("default", "c")
    world.clock[0] += 2 * DAY
    report = await sweep(manager, now=world.clock[0], idle=DAY, is_busy=never_busy, dry_run=True)
    assert [e.action for e in report.entries] == ["would remove"]
    assert checkout.path.exists()


async def test_hostile_ids_stay_inside_the_worktrees_root(world: World) -> None:
    manager = world.manager(world.app)
    for conversation in ("../../escape", "/etc", "a/../../b", "\x00", "x" * 10_000):
        (checkout,) = await manager.prepare("default", conversation)
        assert checkout.usable, checkout.error
        assert checkout.path.parent.parent == world.root
    assert not (world.root.parent.parent / "escape").exists()
    assert sorted(Path(p).name for p in world.root.iterdir()) == sorted(
        f.path.name for f in manager.folders()
    )
