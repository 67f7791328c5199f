"""A finish made of several store calls is recorded whole or not at all, on every store.

The finish of a run is one ledger operation: ``finish``, then on a usage
limit ``set_account_limit``, ``requeue`` and ``add_note``, then
``set_conversation_session``. Should a later call fail, the supervisor is
told the finish failed; the ledger must then hold none of it, or it would
disagree with the supervisor (a run finished with no finish reported, or
queued again where no scheduler will ever start it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from supervisor_support import config_at, unrecorded_finish, write_config

from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec, RunCancel, UsageLimit
from herdsman.runtime.store import MemoryStore, NewRun, RunStatus, SqliteStore, StoreError
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.runtime.supervisor import Supervisor


class FailsOnce:
    """Mixed into a real store: the store call named ``failing`` raises once."""

    failing: str | None = None

    def __getattribute__(self, name: str) -> Any:
        if name == object.__getattribute__(self, "failing"):
            self.failing = None

            def fail(*args: Any, **kwargs: Any) -> Any:
                raise StoreError(f"run ledger: database or disk is full ({name})")

            return fail
        return super().__getattribute__(name)


class FlakyMemory(FailsOnce, MemoryStore):
    pass


class FlakySqlite(FailsOnce, SqliteStore):
    pass


class FlakyPostgres(FailsOnce, PostgresStore):
    pass


Flaky = FlakyMemory | FlakySqlite | FlakyPostgres


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Flaky]:
    """Each kind of ledger, failing the call a test names once."""
    made: Flaky
    if request.param == "postgres":  # a sole supervisor's, not a fleet's
        made = FlakyPostgres(request.getfixturevalue("postgres_url"))
    else:
        made = FlakySqlite(tmp_path / "herdsman.db") if request.param == "sqlite" else FlakyMemory()
    yield made
    made.close()


async def end_of_r1(
    tmp_path: Path,
    store: Flaky,
    failing: str,
    ended: ProcessOutcome,
    caplog: pytest.LogCaptureFixture,
    *,
    conversation: str | None = None,
) -> None:
    """Run r1 once, ending as ``ended``, its finish's call ``failing`` failing once.

    Waits until the supervisor has logged the finish as unrecorded, naming
    that call's error, and has let the run go.
    """
    store.failing = failing
    attempts: list[str] = []

    async def execute(
        spec: ProcessSpec, *, cancel: RunCancel | None = None, task_status: Any = None
    ) -> ProcessOutcome:
        attempts.append(spec.env["HERDSMAN_RUN_ID"])
        return ended

    config = config_at(
        write_config(tmp_path, extra_provider='[[providers.demo.accounts]]\nname = "a"\n')
    )
    supervisor = Supervisor(config, store, execute=execute)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.submit(
            NewRun(id="r1", provider="demo", prompt="x", conversation=conversation)
        )
        logged = await unrecorded_finish(caplog, "r1")
        assert f"database or disk is full ({failing})" in logged
        # Let go in the scheduler: nothing running, nothing queued again.
        with trio.fail_after(10):
            while supervisor.status()["running"]:
                await trio.sleep(0.02)
        assert supervisor.status()["queued"] == 0
        nursery.cancel_scope.cancel()
    assert attempts == ["r1"]


async def test_a_finish_whose_session_cannot_be_kept_is_not_recorded_at_all(
    tmp_path: Path,
    store: Flaky,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ended = ProcessOutcome(Outcome.SUCCEEDED, 0, None, None, "ok", "sess-1", "", None)
    await end_of_r1(tmp_path, store, "set_conversation_session", ended, caplog, conversation="c1")
    # As the supervisor said: not recorded. The run is still running in
    # the ledger (a restart reports it lost), and no session was kept.
    record = store.get("r1")
    assert record is not None
    assert record.status is RunStatus.RUNNING
    assert record.finished_at is None
    assert store.conversation_session("demo", "default", "c1") is None


async def test_a_usage_limited_finish_whose_note_cannot_be_added_is_not_recorded_at_all(
    tmp_path: Path,
    store: Flaky,
    caplog: pytest.LogCaptureFixture,
) -> None:
    limit = UsageLimit(time.time() + 3600, "You've hit your limit")
    ended = ProcessOutcome(Outcome.FAILED, 1, "limit", None, None, None, "", limit)
    await end_of_r1(tmp_path, store, "add_note", ended, caplog)
    # Neither finished, nor re-queued behind the scheduler's back (where
    # nothing would ever start it), nor its account marked limited.
    record = store.get("r1")
    assert record is not None
    assert record.status is RunStatus.RUNNING
    assert record.notes == ()
    assert store.queued_in_order() == []
    assert store.account_limits(0.0) == []
