"""A cancel the ledger refuses leaves the run queued in the scheduler too, however it was taken."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from store_faults import StalledStore
from supervisor_support import config_at, write_config

from herdsman.config import Config
from herdsman.runtime.api.app import create_app
from herdsman.runtime.store import MemoryStore, NewRun, RunRecord, RunStatus
from herdsman.runtime.supervisor import CancelNotRecorded, Supervisor


async def cancel_as_the_ledger_resumes(
    nursery: trio.Nursery, store: StalledStore, supervisor: Supervisor, run_id: str
) -> object:
    """Ask to cancel ``run_id`` while a stalled store call holds the ledger; let it go.

    What the cancel came back with: a record, or the exception it raised.
    """
    answers: list[object] = []

    async def cancel() -> None:
        try:
            answers.append(await supervisor.cancel(run_id))
        except Exception as exc:
            answers.append(exc)

    nursery.start_soon(cancel)
    await trio.testing.wait_all_tasks_blocked()
    store.go.set()
    with trio.fail_after(10):
        while not answers:
            await trio.sleep(0.01)
    [answer] = answers
    return answer


async def submit_behind_a_busy_run(
    nursery: trio.Nursery, store: StalledStore, supervisor: Supervisor, *, in_flight: bool
) -> None:
    """Serve ``supervisor`` (one slot); run "busy", then queue "next" behind it.

    ``in_flight``: the submit of "next" is left stalled in the store.
    """
    await nursery.start(supervisor.run)
    await supervisor.submit(NewRun(id="busy", provider="demo", prompt="x"))
    if not in_flight:
        await supervisor.submit(NewRun(id="next", provider="demo", prompt="x"))
        return
    store.stall("submit")
    nursery.start_soon(supervisor.submit, NewRun(id="next", provider="demo", prompt="x"))
    await trio.to_thread.run_sync(store.entered.wait)


def one_slot(tmp_path: Path) -> Config:
    return config_at(write_config(tmp_path, concurrency=1, delay=0.5))


async def test_a_refused_cancel_of_a_run_whose_submit_was_in_flight_keeps_it_queued(
    tmp_path: Path,
) -> None:
    store = StalledStore(set(), failing_once=frozenset({"cancel_queued"}))
    supervisor = Supervisor(one_slot(tmp_path), store)
    async with trio.open_nursery() as nursery:
        await submit_behind_a_busy_run(nursery, store, supervisor, in_flight=True)
        # The scheduler does not know "next" yet: the cancel waits for the ledger.
        refused = await cancel_as_the_ledger_resumes(nursery, store, supervisor, "next")
        with trio.fail_after(10):
            assert isinstance(refused, CancelNotRecorded), refused
            assert str(refused) == (
                "could not record the cancel of run next (run ledger: database is locked"
                " (cancel_queued)); it is still queued: ask again"
            )
            assert supervisor.status()["queued"] == 1
            # Still queued in both the ledger and the scheduler: it runs in turn.
            assert (await supervisor.wait("next", 10)).status is RunStatus.SUCCEEDED
        nursery.cancel_scope.cancel()


async def test_a_refused_cancel_of_a_run_requeued_at_a_usage_limit_keeps_it_queued(
    tmp_path: Path,
) -> None:
    from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec, RunCancel, UsageLimit

    store = StalledStore(set(), failing_once=frozenset({"cancel_queued"}))
    attempts: list[str] = []

    async def execute(
        spec: ProcessSpec, *, cancel: RunCancel | None = None, task_status: Any = None
    ) -> ProcessOutcome:
        attempts.append(spec.env["HERDSMAN_RUN_ID"])
        if len(attempts) > 1:
            return ProcessOutcome(Outcome.SUCCEEDED, 0, None, None, "ok", None, "", None)
        store.stall("finish")  # the cancel below comes while this end is recorded
        limit = UsageLimit(time.time() + 1, "You've hit your limit")
        return ProcessOutcome(Outcome.FAILED, 1, "limit", None, None, None, "", limit)

    config = config_at(
        write_config(
            tmp_path,
            extra_provider='[[providers.demo.accounts]]\nname = "a"\n',
        )
    )
    supervisor = Supervisor(config, store, execute=execute)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x"))
        await trio.to_thread.run_sync(store.entered.wait)
        # The scheduler still has r1 running; the ledger is recording its
        # re-queue, and the cancel's read of the record waits behind it.
        refused = await cancel_as_the_ledger_resumes(nursery, store, supervisor, "r1")
        with trio.fail_after(10):
            assert isinstance(refused, CancelNotRecorded), refused
            assert supervisor.status()["queued"] == 1
            # Queued in the ledger, so in the scheduler too: it goes again
            # once its account has rested.
            assert (await supervisor.wait("r1", 10)).status is RunStatus.SUCCEEDED
        nursery.cancel_scope.cancel()
    assert attempts == ["r1", "r1"]


@pytest.mark.parametrize("in_flight", [False, True])
async def test_a_cancel_the_ledger_records_leaves_nothing_to_restore(
    tmp_path: Path, in_flight: bool
) -> None:
    store = StalledStore(set())
    supervisor = Supervisor(one_slot(tmp_path), store)
    async with trio.open_nursery() as nursery:
        await submit_behind_a_busy_run(nursery, store, supervisor, in_flight=in_flight)
        record = await cancel_as_the_ledger_resumes(nursery, store, supervisor, "next")
        assert getattr(record, "status", record) is RunStatus.CANCELLED
        assert supervisor.status()["queued"] == 0
        nursery.cancel_scope.cancel()


async def test_the_api_answers_a_refused_cancel_503_saying_the_run_is_still_queued(
    tmp_path: Path,
) -> None:
    store = StalledStore(set(), failing_once=frozenset({"cancel_queued"}))
    supervisor = Supervisor(one_slot(tmp_path), store)
    transport = httpx.ASGITransport(app=create_app(supervisor, "t"))
    headers = {"Authorization": "Bearer t"}
    async with trio.open_nursery() as nursery:
        await submit_behind_a_busy_run(nursery, store, supervisor, in_flight=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            refused = await client.post("/v1/runs/next/cancel", headers=headers)
            again = await client.post("/v1/runs/next/cancel", headers=headers)
        assert (refused.status_code, refused.json()["error"]) == (
            503,
            "could not record the cancel of run next (run ledger: database is locked"
            " (cancel_queued)); it is still queued: ask again",
        )
        assert (again.status_code, again.json()["status"]) == (200, "cancelled")
        nursery.cancel_scope.cancel()


async def test_a_refused_cancel_keeps_the_run_in_its_place_in_its_conversation(
    tmp_path: Path,
) -> None:
    store = StalledStore(set(), failing_once=frozenset({"cancel_queued"}))
    supervisor = Supervisor(one_slot(tmp_path), store)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for run_id in ("busy", "first", "second"):
            new = NewRun(id=run_id, provider="demo", prompt="x", conversation="c")
            await supervisor.submit(new)
        with pytest.raises(CancelNotRecorded):
            await supervisor.cancel("first")
        with trio.fail_after(10):
            records = [await supervisor.wait(run_id, 10) for run_id in ("first", "second")]
        nursery.cancel_scope.cancel()
    assert [r.status for r in records] == [RunStatus.SUCCEEDED, RunStatus.SUCCEEDED]
    first, second = records
    assert first.started_at is not None
    assert second.started_at is not None
    # A conversation's runs start in arrival order: the refused cancel put
    # "first" back where it was, ahead of "second", not behind it.
    assert first.started_at < second.started_at


async def test_a_refused_cancel_whose_caller_was_cancelled_meanwhile_keeps_the_run_queued(
    tmp_path: Path,
) -> None:
    store = StalledStore(set(), failing_once=frozenset({"cancel_queued"}))
    supervisor = Supervisor(one_slot(tmp_path), store)
    answers: list[object] = []

    async def cancel_next(*, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            try:
                answers.append(await supervisor.cancel("next"))
            except Exception as exc:
                answers.append(exc)

    async with trio.open_nursery() as nursery:
        await submit_behind_a_busy_run(nursery, store, supervisor, in_flight=False)
        # A read holds the ledger, so the cancel's record waits behind it...
        store.stall("get")
        nursery.start_soon(supervisor.get, "busy")
        await trio.to_thread.run_sync(store.entered.wait)
        scope = await nursery.start(cancel_next)
        await trio.testing.wait_all_tasks_blocked()
        assert supervisor.status()["queued"] == 0  # withdrawn, its cancel queued
        # ...and its caller gives up (a client that hung up) before it commits.
        scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        store.go.set()
        with trio.fail_after(10):
            # The ledger refused the cancel: the run is queued there, so here
            # too, and runs in turn.
            assert (await supervisor.wait("next", 5)).status is RunStatus.SUCCEEDED
        nursery.cancel_scope.cancel()
    # The caller still learned that its cancel was not recorded.
    assert [type(answer) for answer in answers] == [CancelNotRecorded]


class CancelBreaksOnce(MemoryStore):
    """A ledger whose first cancel fails with an error that is no store failure (a bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.broke = False

    def cancel_queued(self, run_id: str, now: float, reason: str) -> RunRecord:
        if not self.broke:
            self.broke = True
            raise RuntimeError("the store met a bug")
        return super().cancel_queued(run_id, now, reason)


async def test_a_cancel_that_fails_with_no_store_error_keeps_the_run_in_its_place(
    tmp_path: Path,
) -> None:
    store = CancelBreaksOnce()
    supervisor = Supervisor(one_slot(tmp_path), store)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for run_id in ("busy", "first", "second"):
            new = NewRun(id=run_id, provider="demo", prompt="x", conversation="c")
            await supervisor.submit(new)
        with pytest.raises(RuntimeError, match="the store met a bug"):
            await supervisor.cancel("first")
        # Undone in the ledger, so queued in the scheduler again, ahead of "second".
        assert supervisor.status()["queued"] == 2
        with trio.fail_after(10):
            records = [await supervisor.wait(run_id, 10) for run_id in ("first", "second")]
        nursery.cancel_scope.cancel()
    assert [r.status for r in records] == [RunStatus.SUCCEEDED, RunStatus.SUCCEEDED]
    first, second = records
    assert first.started_at is not None
    assert second.started_at is not None
    assert first.started_at < second.started_at
