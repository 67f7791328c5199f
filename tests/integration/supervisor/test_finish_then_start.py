"""A finish and the starts it frees commit in one transaction, never the start first.

The supervisor frees a finished run's slot and lanes when it queues the
finish, and queues the starts that frees right behind it. These tests hold it
to what makes that safe: the two land in one commit of the real SQLite ledger;
after every commit, what a crash would leave shows no lane or cap held twice;
and a supervisor being torn down starts nothing more.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import outcome
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from supervisor_support import config_at, write_config

from herdsman.core import RunRequest, busy_keys
from herdsman.core.runs import conflict
from herdsman.runtime.requests import run_request
from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec, RunCancel
from herdsman.runtime.store import NewRun, RunEnd, RunRecord, RunStatus, Store
from herdsman.runtime.store.sqlite import SqliteStore
from herdsman.runtime.supervisor import Supervisor


class BatchLog(SqliteStore):
    """A real SQLite ledger that notes which commit started and finished each run."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.commits = 0
        self.durable: list[bool] = []
        self.started_in: dict[str, int] = {}
        self.finished_in: dict[str, int] = {}
        self.after_commit: Callable[[], None] = lambda: None

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        self.commits += 1
        self.durable.append(durable)
        results = super().apply(operations, durable=durable)
        self.after_commit()
        return results

    def mark_running_many(
        self, items: Sequence[tuple[str, str | None]], now: float
    ) -> list[RunRecord]:
        records = super().mark_running_many(items, now)
        for run_id, _ in items:
            self.started_in[run_id] = self.commits
        return records

    def finish(self, run_id: str, end: RunEnd, now: float) -> RunRecord:
        record = super().finish(run_id, end, now)
        self.finished_in[run_id] = self.commits
        return record


async def test_the_next_run_on_a_lane_starts_in_the_commit_of_the_finish(
    tmp_path: Path,
) -> None:
    config = config_at(write_config(tmp_path, concurrency=1, delay=0.05))
    store = BatchLog(tmp_path / "ledger.db")
    supervisor = Supervisor(config, store)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        await supervisor.submit_many(
            [
                (NewRun(id=f"r{n}", provider="demo", prompt="x", conversation="c"), "queue")
                for n in range(1, 4)
            ]
        )
        with trio.fail_after(30):
            for n in range(1, 4):
                assert (await supervisor.wait(f"r{n}", 30)).status is RunStatus.SUCCEEDED
        nursery.cancel_scope.cancel()
    for earlier, later in (("r1", "r2"), ("r2", "r3")):
        commit = store.finished_in[earlier]
        assert store.started_in[later] == commit
        # A start in it makes the commit durable: the finish reaches the disk with it.
        assert store.durable[commit - 1]


async def test_a_supervisor_torn_down_starts_nothing_after_a_finish(tmp_path: Path) -> None:
    config = config_at(write_config(tmp_path, concurrency=1, delay=30))
    store = BatchLog(tmp_path / "ledger.db")
    supervisor = Supervisor(config, store)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for n in (1, 2):
            await supervisor.submit(
                NewRun(id=f"r{n}", provider="demo", prompt="x", conversation="c")
            )
        with trio.fail_after(10):
            while "r1" not in store.started_in:
                await trio.sleep(0.01)
        # Cancelled from outside, as a crash of the enclosing program would:
        # r1's task records its end, and must not start r2 behind it.
        nursery.cancel_scope.cancel()
    first, second = store.get("r1"), store.get("r2")
    assert first is not None
    assert first.status is RunStatus.CANCELLED
    assert second is not None
    assert second.status is RunStatus.QUEUED
    assert "r2" not in store.started_in


# -- the property: every commit leaves a state a crash may show -------------------

runs = st.lists(
    st.tuples(
        st.sampled_from([None, "c1", "c2"]),  # conversation
        st.sampled_from([None, "a1"]),  # agent
        st.sampled_from([0.0, 1.0, 3.0]),  # how long its process runs
        st.sampled_from([0.0, 0.5, 2.0]),  # when it is submitted, after the one before
    ),
    min_size=1,
    max_size=10,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    plan=runs,
    concurrency=st.integers(1, 3),
    cap=st.sampled_from([None, 1, 2]),
    commit_time=st.sampled_from([0.0, 0.25, 1.0]),
)
def test_no_commit_shows_a_lane_or_a_slot_held_twice(
    plan: list[tuple[str | None, str | None, float, float]],
    concurrency: int,
    cap: int | None,
    commit_time: float,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        config = config_at(write_config(directory, concurrency=concurrency, max_concurrency=cap))
        store = BatchLog(directory / "ledger.db")
        try:
            trio.run(
                _drive,
                config,
                store,
                plan,
                commit_time,
                clock=trio.testing.MockClock(autojump_threshold=0),
            )
        finally:
            store.close()


async def _drive(
    config: Any,
    store: BatchLog,
    plan: list[tuple[str | None, str | None, float, float]],
    commit_time: float,
) -> None:
    limit = min(config.providers["demo"].concurrency, config.supervisor.max_concurrency or 99)
    requests: dict[str, RunRequest] = {}
    violations: list[str] = []
    spawned: list[str] = []

    def check() -> None:
        # What a crash right after this commit would leave behind.
        running = store.list_runs(status=RunStatus.RUNNING, limit=1000)
        if len(running) > limit:
            violations.append(f"{len(running)} running over a limit of {limit}")
        violations.extend(
            f"{a.id} and {b.id} run at once on one lane"
            for i, a in enumerate(running)
            for b in running[i + 1 :]
            if conflict(requests[a.id], requests[b.id], agent_exclusive=True)
        )

    store.after_commit = check

    async def commit_later(fn: Callable[[], Any]) -> Any:
        # The commit takes a while, as a worker thread's fsync does: calls pile up.
        await trio.sleep(commit_time)
        return fn()

    async def execute(
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> ProcessOutcome:
        run_id = spec.env["HERDSMAN_RUN_ID"]
        record = store.get(run_id)
        if record is None or record.status is not RunStatus.RUNNING:
            violations.append(f"{run_id} spawned while not recorded as running")
        spawned.append(run_id)
        task_status.started(0)
        await trio.sleep(durations[run_id])
        return ProcessOutcome(Outcome.SUCCEEDED, 0, None, None, None, None, "", None)

    durations: dict[str, float] = {}
    supervisor = Supervisor(
        config,
        store,
        execute=execute,
        wall=trio.current_time,
        run_sync=commit_later,
        stop_orphans=False,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for n, (conversation, agent, duration, gap) in enumerate(plan):
            await trio.sleep(gap)
            run_id = f"r{n}"
            durations[run_id] = duration
            new = NewRun(
                id=run_id, provider="demo", prompt="x", conversation=conversation, agent=agent
            )
            requests[run_id] = run_request(new)
            await supervisor.submit(new)
        for run_id in durations:
            assert (await supervisor.wait(run_id, 1e6)).status is RunStatus.SUCCEEDED
        nursery.cancel_scope.cancel()
    assert violations == []
    assert sorted(spawned) == sorted(durations)  # each run spawned once
    # Runs sharing a lane started in the order they were submitted.
    order = sorted(durations, key=lambda run_id: int(run_id[1:]))
    for key in {
        k for request in requests.values() for k in busy_keys(request, agent_exclusive=True)
    }:
        lane = [r for r in order if key in busy_keys(requests[r], agent_exclusive=True)]
        records = [store.get(r) for r in lane]
        starts = [r.started_at for r in records if r is not None and r.started_at is not None]
        assert len(starts) == len(lane), key
        assert starts == sorted(starts), key
