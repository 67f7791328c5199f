"""The config file watcher, on a real folder with real inotify (watchfiles)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import watchfiles

from herdsman.runtime import config_watch


async def test_a_change_made_before_the_watch_is_armed_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window between looking up the folders and arming the watch loses nothing."""
    config = tmp_path / "supervisor.toml"
    config.write_text("a")
    real_awatch = watchfiles.awatch

    def late_awatch(*folders: str, **options: Any) -> AsyncIterator[set[Any]]:
        # The file changes after watch_file looked up its folders, before
        # the watch on them exists: inotify never reports this change.
        config.write_text("b")
        return real_awatch(*folders, **options)

    monkeypatch.setattr(watchfiles, "awatch", late_awatch)
    told = trio.Event()

    async def changed() -> None:
        told.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(config_watch.watch_file, config, changed)
        with trio.fail_after(10):
            await told.wait()
        nursery.cancel_scope.cancel()


async def test_a_change_after_the_watch_is_armed_is_reported_after_it_settles(
    tmp_path: Path,
) -> None:
    config = tmp_path / "supervisor.toml"
    config.write_text("a")
    calls: list[bytes | None] = []
    seen = trio.Event()

    async def changed() -> None:
        calls.append(config_watch.file_signature(config))
        seen.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(config_watch.watch_file, config, changed)
        with trio.fail_after(10):
            await seen.wait()  # the armed watch's first look
        seen = trio.Event()
        config.write_text("b")
        with trio.fail_after(10):
            await seen.wait()
        nursery.cancel_scope.cancel()
    assert calls[-1] == config_watch.file_signature(config)
    assert calls[0] != calls[-1]


async def test_changes_beside_the_file_are_not_logged_line_by_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Other files changing in the folder (a checkout's git, a log) print nothing at INFO."""
    caplog.set_level("INFO")
    config = tmp_path / "supervisor.toml"
    config.write_text("a")
    looked = trio.Event()

    async def changed() -> None:
        looked.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(config_watch.watch_file, config, changed)
        with trio.fail_after(10):
            await looked.wait()  # armed
        for n in range(3):
            (tmp_path / f"other-{n}.log").write_text("x")
            await trio.sleep(config_watch.WATCH_SETTLE * 2)
        nursery.cancel_scope.cancel()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("watchfiles")] == []
