"""A run lost in a crash counts as a start and is charged no run-minutes, whenever it was lost."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from supervisor_support import config_at, write_config

from herdsman.runtime.store import MemoryStore, NewRun, SqliteStore, Store
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.supervisor import Supervisor

STARTED = 1_800_000_000.0
MINUTE = 60.0


def store_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    if kind == "postgres":  # a sole supervisor's, not a fleet's
        return PostgresStore(request.getfixturevalue("postgres_url"))
    return SqliteStore(tmp_path / "herdsman.db") if kind == "sqlite" else MemoryStore()


def with_budget(tmp_path: Path, unit: str) -> Path:
    account = f'window = "5h"\nbudget = 300\nbudget_unit = "{unit}"'
    return write_config(
        tmp_path, extra_provider=f'[[providers.demo.accounts]]\nname = "a"\n{account}\n'
    )


def crashed_while_running(store: Store) -> None:
    """Run r0 started on account "a" at STARTED, and the supervisor died under it."""
    store.submit(NewRun(id="r0", provider="demo", prompt="x"), STARTED)
    store.mark_running_many([("r0", "a")], STARTED)


async def usage_at_start(tmp_path: Path, store: Store, unit: str, now: float) -> float:
    """The account's usage as a supervisor starting at ``now`` on ``store`` counts it."""
    supervisor = Supervisor(config_at(with_budget(tmp_path, unit)), store, wall=lambda: now)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        [account] = supervisor.accounts()
        nursery.cancel_scope.cancel()
    usage: float = account["usage"]
    return usage


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
@pytest.mark.parametrize("lost_at", ["this start", "an earlier start"])
async def test_a_lost_run_is_charged_a_start_and_no_minutes(
    tmp_path: Path, kind: str, lost_at: str, request: pytest.FixtureRequest
) -> None:
    store = store_of(kind, tmp_path, request)
    try:
        crashed_while_running(store)
        if lost_at == "an earlier start":
            store.recover(STARTED + 10 * MINUTE)  # a start that then stopped cleanly
        # Else this start finds it running, and records it lost.
        now = STARTED + 30 * MINUTE
        assert await usage_at_start(tmp_path, store, "run_minutes", now) == 0.0
        assert await usage_at_start(tmp_path, store, "runs", now) == 1.0
    finally:
        store.close()


async def test_an_account_a_reload_brings_back_is_charged_no_minutes_for_a_lost_run(
    tmp_path: Path,
) -> None:
    from herdsman.config import load_config
    from herdsman.runtime.reload import ConfigSource

    store = MemoryStore()
    crashed_while_running(store)
    path = with_budget(tmp_path, "run_minutes")
    with_account = path.read_text()
    source = ConfigSource(path, environ={}, watch=False)
    now = STARTED + 30 * MINUTE
    loaded = load_config(path, environ={})
    supervisor = Supervisor(loaded.config, store, source=source, loaded=loaded, wall=lambda: now)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        path.write_text(with_account.replace('name = "a"', 'name = "b"'))
        assert (await supervisor.reload("test")).applied
        assert [a["account"] for a in supervisor.accounts()] == ["b"]
        path.write_text(with_account)
        assert (await supervisor.reload("test")).applied
        [account] = supervisor.accounts()
        nursery.cancel_scope.cancel()
    assert (account["account"], account["usage"]) == ("a", 0.0)
