"""Shutdown racing with the ledger: every run that reached the store ends recorded."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import outcome
import pytest
import trio
from store_faults import FlakyStore, StalledStore
from supervisor_support import config_at, unrecorded_finish, write_config

from herdsman.runtime.store import MemoryStore, NewRun, RunStatus, Store, StoreError
from herdsman.runtime.supervisor import Supervisor


class GatedStore(MemoryStore):
    """Holds every durable batch (a start) until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.durable_waiting = threading.Event()
        self.gate = threading.Event()

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        if durable:
            self.durable_waiting.set()
            self.gate.wait(timeout=30)
        return super().apply(operations, durable=durable)


async def test_cancelling_the_supervisor_during_a_start_commit_records_the_run(
    tmp_path: Path,
) -> None:
    config = config_at(write_config(tmp_path, delay=30))
    store = GatedStore()
    supervisor = Supervisor(config, store)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x"))
        await trio.to_thread.run_sync(store.durable_waiting.wait)
        nursery.cancel_scope.cancel()  # the start commit is in flight
        store.gate.set()
    record = store.get("r1")
    assert record is not None
    # Committed as running, then its task was cancelled before or just after
    # the spawn: recorded as cancelled, never left running, never re-run.
    assert record.status is RunStatus.CANCELLED
    assert record.attempts == 1


async def test_cancelling_the_supervisor_during_a_finish_commit_still_hears_its_outcome(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The run's task waits for its finish to commit with no shielding scope
    # (Ledger.settled): cancelled meanwhile, it must still learn that the
    # ledger refused the finish, and let the run go as a refused finish does.
    store = StalledStore({"finish"})
    store.stall("finish")
    supervisor = Supervisor(config_at(write_config(tmp_path, delay=0.05)), store)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x"))
            assert await trio.to_thread.run_sync(store.entered.wait, 10)
            nursery.cancel_scope.cancel()  # the finish commit is in flight
            store.go.set()
    message = await unrecorded_finish(caplog, "r1")
    assert message.startswith("could not record how run r1 ended (succeeded)")
    assert message.endswith("the next start will report it lost")
    record = store.get("r1")
    assert record is not None
    assert record.status is RunStatus.RUNNING  # as the ledger has it: lost at the next start


@asynccontextmanager
async def serving(supervisor: Supervisor) -> AsyncIterator[trio.Nursery]:
    """The supervisor running (recovered) for the block; cancelled after it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        yield nursery
        nursery.cancel_scope.cancel()


class StuckGit:
    """A git whose worktree creation never finishes (a hanging hook, a dead NFS)."""

    def __init__(self) -> None:
        self.adding = trio.Event()

    async def branch_exists(self, repo: Path, branch: str) -> bool:
        return False

    async def head(self, repo: Path) -> str:
        return "0" * 40

    async def add_worktree(
        self, repo: Path, path: Path, *, branch: str | None, commit: str
    ) -> None:
        self.adding.set()
        await trio.sleep_forever()


def stuck_config(tmp_path: Path) -> Any:
    return config_at(
        write_config(tmp_path, delay=0.1, extra=f'[[repos]]\nname = "app"\npath = "{tmp_path}"\n')
    )


async def test_a_run_stuck_preparing_its_checkouts_can_be_cancelled(tmp_path: Path) -> None:
    git = StuckGit()
    store = MemoryStore()
    supervisor = Supervisor(stuck_config(tmp_path), store, git=git)  # type: ignore[arg-type]
    async with serving(supervisor):
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x", conversation="c"))
        with trio.fail_after(10):
            await git.adding.wait()
            await supervisor.cancel("r1")
            done = await supervisor.wait("r1", 10)
        assert (done.status, done.reason, done.exit_code) == (
            RunStatus.CANCELLED,
            "cancel requested",
            None,
        )
        # The slot is free again: a run without a conversation (no checkout) starts.
        await supervisor.submit(NewRun(id="r2", provider="demo", prompt="x"))
        with trio.fail_after(10):
            assert (await supervisor.wait("r2", 10)).status is RunStatus.SUCCEEDED


async def test_a_forced_shutdown_does_not_hang_on_a_stuck_preparation(tmp_path: Path) -> None:
    git = StuckGit()
    supervisor = Supervisor(stuck_config(tmp_path), MemoryStore(), git=git)  # type: ignore[arg-type]
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x", conversation="c"))
            await git.adding.wait()
            supervisor.request_shutdown()
            supervisor.request_shutdown()
    assert supervisor.report is not None
    assert supervisor.report.cancelled == ("r1",)


async def test_a_prune_that_fails_is_logged_and_scheduling_goes_on(tmp_path: Path) -> None:
    store = FlakyStore({"prune"})
    supervisor = Supervisor(config_at(write_config(tmp_path, delay=0.1)), store)
    async with serving(supervisor):
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x"))
        with trio.fail_after(10):
            assert (await supervisor.wait("r1", 10)).status is RunStatus.SUCCEEDED


async def test_a_cancel_the_ledger_refuses_leaves_the_run_queued(tmp_path: Path) -> None:
    store = FlakyStore({"cancel_queued"})
    supervisor = Supervisor(config_at(write_config(tmp_path, concurrency=1, delay=0.5)), store)
    async with serving(supervisor):
        await supervisor.submit(NewRun(id="busy", provider="demo", prompt="x"))
        await supervisor.submit(NewRun(id="next", provider="demo", prompt="x"))
        with pytest.raises(StoreError):
            await supervisor.cancel("next")
        # Still queued in both the ledger and the scheduler: it runs in turn.
        with trio.fail_after(10):
            assert (await supervisor.wait("next", 10)).status is RunStatus.SUCCEEDED


async def test_a_start_the_ledger_refuses_stops_the_supervisor_as_fatal(tmp_path: Path) -> None:
    store = FlakyStore({"mark_running_many"})
    supervisor = Supervisor(config_at(write_config(tmp_path)), store)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x"))
    assert supervisor.report is not None
    assert supervisor.report.fatal is not None
    assert "could not record a start" in supervisor.report.fatal
    record = store.get("r1")
    assert record is not None
    assert (record.status, record.attempts) == (RunStatus.QUEUED, 0)
    # Never spawned, so it spent nothing of its account's budget.
    assert [a["runs_started"] for a in supervisor.accounts()] == [0]


async def test_a_run_is_not_recorded_while_its_conversations_worktree_is_removed(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    supervisor = Supervisor(stuck_config(tmp_path), store, git=StuckGit())  # type: ignore[arg-type]
    async with serving(supervisor) as nursery:
        assert supervisor.worktrees is not None
        recorded = trio.Event()

        async def submit() -> None:
            await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x", conversation="c"))
            recorded.set()

        with supervisor.worktrees.removing("default", "c"):  # a sweep's removal under way
            nursery.start_soon(submit)
            await trio.testing.wait_all_tasks_blocked()
            assert store.get("r1") is None
            # Already busy, so the sweep removes nothing more of it.
            assert supervisor.conversation_busy("default", "c")
        with trio.fail_after(5):
            await recorded.wait()
        assert store.get("r1") is not None


async def test_a_run_preparing_its_checkouts_holds_up_no_submit(tmp_path: Path) -> None:
    git = StuckGit()
    store = MemoryStore()
    supervisor = Supervisor(stuck_config(tmp_path), store, git=git)  # type: ignore[arg-type]
    async with serving(supervisor):
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x", conversation="c"))
        with trio.fail_after(5):
            await git.adding.wait()  # r1 is stuck making its worktree
            skipped, _ = await supervisor.submit(
                NewRun(id="r2", provider="demo", prompt="x", conversation="c"), "skip"
            )
            results = await supervisor.submit_many(
                [
                    (NewRun(id="x", provider="demo", prompt="x"), "queue"),
                    (NewRun(id="r3", provider="demo", prompt="x", conversation="c"), "queue"),
                ]
            )
        assert skipped.status is RunStatus.SKIPPED
        assert [(r.id, created) for r, created in results] == [("x", True), ("r3", True)]


async def test_sharing_a_folder_is_not_a_duplicate_follow_up(tmp_path: Path) -> None:
    supervisor = Supervisor(config_at(write_config(tmp_path, delay=0.1)), MemoryStore())
    async with serving(supervisor):
        results = await supervisor.submit_many(
            [
                (NewRun(id="a1", provider="demo", prompt="x", cwd=str(tmp_path)), "skip"),
                (NewRun(id="a2", provider="demo", prompt="x", cwd=str(tmp_path)), "skip"),
            ]
        )
        assert [r.status for r, _ in results] == [RunStatus.QUEUED, RunStatus.QUEUED]


class GatedGit(StuckGit):
    """A git whose worktree creation waits for ``release``, then fails (read-only repo)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = trio.Event()

    async def add_worktree(
        self, repo: Path, path: Path, *, branch: str | None, commit: str
    ) -> None:
        from herdsman.runtime.git.port import GitError

        self.adding.set()
        await self.release.wait()
        raise GitError("released")


async def test_a_run_is_built_from_the_config_its_start_was_decided_under(
    tmp_path: Path,
) -> None:
    from herdsman.config import load_config
    from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec, RunCancel

    seen: list[ProcessSpec] = []

    async def execute(
        spec: ProcessSpec, *, cancel: RunCancel | None = None, task_status: Any = None
    ) -> ProcessOutcome:
        seen.append(spec)
        return ProcessOutcome(Outcome.SUCCEEDED, 0, None, None, "ok", None, "", None)

    path = write_config(
        tmp_path,
        extra_provider='env = { STAGE = "before" }\n',
        extra=f'[[repos]]\nname = "app"\npath = "{tmp_path}"\n',
    )
    loaded = load_config(path, environ={})
    git = GatedGit()
    supervisor = Supervisor(
        loaded.config,
        MemoryStore(),
        git=git,  # type: ignore[arg-type]
        execute=execute,
        loaded=loaded,
    )
    async with serving(supervisor):
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x", conversation="c"))
        with trio.fail_after(5):
            await git.adding.wait()
        # While the run prepares its checkouts, a reload changes its provider.
        path.write_text(path.read_text().replace('"before"', '"after"'))
        result = await supervisor.reload_to(load_config(path, environ={}), "test")
        assert result.applied
        git.release.set()
        with trio.fail_after(5):
            record = await supervisor.wait("r1", 5)
    assert record.status is RunStatus.SUCCEEDED
    [spec] = seen
    assert spec.env["STAGE"] == "before"


async def test_a_reload_that_crashes_while_reading_is_rejected_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from herdsman.config import load_config
    from herdsman.runtime.reload import ConfigSource
    from herdsman.runtime.supervisor import reloading

    path = write_config(tmp_path)
    source = ConfigSource(path, environ={}, watch=False)
    supervisor = Supervisor(
        config_at(path), MemoryStore(), source=source, loaded=load_config(path, environ={})
    )

    def broken(*args: object) -> None:
        raise RuntimeError("a bug in the loader")

    monkeypatch.setattr(reloading, "effective_config", broken)
    async with serving(supervisor):
        path.write_text(path.read_text().replace("concurrency = 2", "concurrency = 3"))
        result = await supervisor.reload("test")
        assert not result.ok
        assert result.errors == (f"{path}: could not be read: a bug in the loader",)
        assert supervisor.status()["limits"]["providers"] == {"demo": 2}
        record, _ = await supervisor.submit(NewRun(id="r1", provider="demo", prompt="still"))
        assert (await supervisor.wait(record.id, 10)).status is RunStatus.SUCCEEDED


def account_config(tmp_path: Path, account: str) -> Any:
    return config_at(
        write_config(
            tmp_path, extra_provider=f'[[providers.demo.accounts]]\nname = "a"\n{account}\n'
        )
    )


async def test_a_cancel_racing_a_usage_limited_end_never_lets_the_run_go_again(
    tmp_path: Path,
) -> None:
    from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec, RunCancel, UsageLimit

    release = trio.Event()
    executions: list[str] = []

    async def execute(
        spec: ProcessSpec, *, cancel: RunCancel | None = None, task_status: Any = None
    ) -> ProcessOutcome:
        executions.append(spec.env["HERDSMAN_RUN_ID"])
        await release.wait()  # and deaf to the cancel, like a process already exiting
        limit = UsageLimit(None, "You've hit your limit")
        return ProcessOutcome(Outcome.FAILED, 1, "limit", None, None, None, "", limit)

    supervisor = Supervisor(account_config(tmp_path, ""), MemoryStore(), execute=execute)
    async with serving(supervisor) as nursery:
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x"))
        with trio.fail_after(5):
            while not executions:
                await trio.sleep(0.01)
        answers: list[object] = []

        async def cancel() -> None:
            try:
                answers.append(await supervisor.cancel("r1"))
            except Exception as exc:
                answers.append(exc)

        nursery.start_soon(cancel)
        release.set()
        with trio.fail_after(5):
            record = await supervisor.wait("r1", 5)
        await trio.sleep(0.2)
    assert record.is_terminal, record
    assert record.status in (RunStatus.USAGE_LIMITED, RunStatus.CANCELLED)
    assert executions == ["r1"]  # never started again
    assert not any(isinstance(answer, KeyError) for answer in answers), answers


async def test_a_run_that_never_spawned_gives_its_budget_back(tmp_path: Path) -> None:
    from herdsman.runtime.runner import ProcessOutcome, ProcessSpec, RunCancel

    async def execute(
        spec: ProcessSpec, *, cancel: RunCancel | None = None, task_status: Any = None
    ) -> ProcessOutcome:
        raise FileNotFoundError(2, "No such file or directory", "agent")

    config = account_config(tmp_path, 'window = "1h"\nbudget = 1')
    supervisor = Supervisor(config, MemoryStore(), execute=execute)
    async with serving(supervisor):
        for run_id in ("r1", "r2"):
            await supervisor.submit(NewRun(id=run_id, provider="demo", prompt="x"))
            with trio.fail_after(5):
                assert (await supervisor.wait(run_id, 5)).status is RunStatus.FAILED
        [account] = supervisor.accounts()
    assert (account["usage"], account["available"]) == (0.0, True)


async def test_a_run_lost_in_a_crash_is_not_charged_the_outage(tmp_path: Path) -> None:
    config = account_config(tmp_path, 'window = "5h"\nbudget = 300\nbudget_unit = "run_minutes"')
    store = MemoryStore()
    crashed_at = 1_800_000_000.0
    store.submit(NewRun(id="r0", provider="demo", prompt="x"), crashed_at - 60)
    store.mark_running_many([("r0", "a")], crashed_at - 60)
    back = crashed_at + 8 * 3600  # an outage of 8 hours
    supervisor = Supervisor(config, store, wall=lambda: back)
    async with serving(supervisor):
        [account] = supervisor.accounts()
    assert (account["usage"], account["available"]) == (0.0, True)


async def test_a_finish_the_ledger_refuses_says_the_next_start_reports_the_run_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyStore({"finish"})
    supervisor = Supervisor(config_at(write_config(tmp_path, delay=0.1)), store)
    async with serving(supervisor):
        await supervisor.submit(NewRun(id="r1", provider="demo", prompt="x"))
        message = await unrecorded_finish(caplog, "r1")
    assert message == (
        "could not record how run r1 ended (succeeded): run ledger: database is locked"
        " (finish); the next start will report it lost"
    )
    record = store.get("r1")
    assert record is not None
    assert record.status is RunStatus.RUNNING
