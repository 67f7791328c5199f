"""With an inline ledger, the task that submits or finishes a run takes the starts it allows.

The simulator's ledger applies every call at once, so there is no commit to
batch starts behind: waking the dispatcher after each submit and finish was a
scheduling round per event that found nothing left to do. It is still woken
when its timer for a resting account must be set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from herdsman.config import load_config_text
from herdsman.runtime.ledger import inline
from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec
from herdsman.runtime.store import MemoryStore, NewRun, RunStatus
from herdsman.runtime.supervisor import Supervisor

ONE_SLOT = """\
[supervisor]
state_dir = "{state}"
[providers.p]
exec = ["p"]
concurrency = 1
"""

# One account that may start two runs an hour.
ACCOUNT = '[[providers.p.accounts]]\nname = "a"\nwindow = "1h"\nbudget = 2\n'
TWO_RUNS_AN_HOUR = ONE_SLOT + ACCOUNT

# The same account, one slot in all (the global cap) and two for the provider.
ONE_GLOBAL_SLOT = (
    """\
[supervisor]
state_dir = "{state}"
max_concurrency = 1
[providers.p]
exec = ["p"]
concurrency = 2
"""
    + ACCOUNT
)


class DispatcherSteps(trio.abc.Instrument):
    """Counts the dispatcher task's steps (each one a scheduling round it took)."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith(".dispatch_loop"):
            self.steps += 1


class Agents:
    """A fake runner whose runs end when the test says so; it records the start order."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._done: dict[str, trio.Event] = {}

    async def execute(self, spec: ProcessSpec, **_: Any) -> ProcessOutcome:
        run_id = spec.env["HERDSMAN_RUN_ID"]
        self.started.append(run_id)
        done = self._done[run_id] = trio.Event()
        await done.wait()
        return ProcessOutcome(
            status=Outcome.SUCCEEDED,
            exit_code=0,
            reason=None,
            limit=None,
            result="ok",
            session_id=None,
            excerpt="",
            usage_limit=None,
        )

    def end(self, run_id: str) -> None:
        self._done.pop(run_id).set()


def _supervisor(config: str, state: Path, agents: Agents, clock: trio.testing.MockClock) -> Any:
    loaded = load_config_text(config.format(state=state), state / "s.toml", environ={})
    return Supervisor(
        loaded.config,
        MemoryStore(),
        execute=agents.execute,
        run_sync=inline,
        stop_orphans=False,
        resolve_program=lambda name: name,
        wall=lambda: 1_000_000.0 + clock.current_time(),
    )


def _new(run_id: str) -> NewRun:
    return NewRun(id=run_id, provider="p", prompt="x")


def test_runs_start_and_end_without_a_dispatcher_round(tmp_path: Path) -> None:
    agents, dispatcher, clock = Agents(), DispatcherSteps(), trio.testing.MockClock()
    statuses: list[RunStatus | None] = []

    async def main() -> None:
        supervisor = _supervisor(ONE_SLOT, tmp_path, agents, clock)
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.add_instrument(dispatcher)
            for run_id in ("r1", "r2", "r3"):
                await supervisor.submit(_new(run_id))
                await trio.testing.wait_all_tasks_blocked()
            for run_id in ("r1", "r2", "r3"):
                agents.end(run_id)
                await trio.testing.wait_all_tasks_blocked()
            trio.lowlevel.remove_instrument(dispatcher)
            for run_id in ("r1", "r2", "r3"):
                record = await supervisor.get(run_id)
                statuses.append(None if record is None else record.status)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    assert agents.started == ["r1", "r2", "r3"]
    assert statuses == [RunStatus.SUCCEEDED] * 3
    # r1 started by its submit, r2 and r3 by the finishes before them.
    assert dispatcher.steps == 0


def _rechecks(config: str, state: Path, ends: list[str]) -> tuple[list[str], list[float | None]]:
    """Submit r1, r2 and r3, then end ``ends`` in turn: the runs started, and the
    dispatcher's timer after the submits and after each end."""
    agents, clock = Agents(), trio.testing.MockClock()
    seen: list[float | None] = []

    async def main() -> None:
        supervisor = _supervisor(config, state, agents, clock)
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            for run_id in ("r1", "r2", "r3"):
                await supervisor.submit(_new(run_id))
            await trio.testing.wait_all_tasks_blocked()
            seen.append(supervisor.account_recheck_at)
            for run_id in ends:
                agents.end(run_id)
                await trio.testing.wait_all_tasks_blocked()
                seen.append(supervisor.account_recheck_at)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    return agents.started, seen


def test_a_start_that_spends_an_accounts_budget_still_sets_the_dispatchers_timer(
    tmp_path: Path,
) -> None:
    # r2 and r3 wait for the global slot. r1's finish starts r2, which spends
    # the account's last run this hour: r3, free of its lanes and with a slot
    # of its provider's, now waits for the account (and the global slot), and
    # the dispatcher must look again when the window frees it (at the latest
    # in a minute).
    started, seen = _rechecks(ONE_GLOBAL_SLOT, tmp_path, ["r1"])
    assert started == ["r1", "r2"]
    assert seen[0] is None
    assert seen[1] is not None
    assert 0 < seen[1] <= 60.0


def test_a_run_waiting_for_its_providers_slot_sets_no_timer(tmp_path: Path) -> None:
    # As above with one slot for the provider: after r1's finish r3 waits for
    # r2's slot as well as for the account, and only r2's finish (an event)
    # can free that slot, so the dispatcher has nothing to look at when the
    # window frees the account; it looks again after that finish, when r3
    # waits for the account alone.
    started, seen = _rechecks(TWO_RUNS_AN_HOUR, tmp_path, ["r1", "r2"])
    assert started == ["r1", "r2"]
    assert seen[1] is None
    assert seen[2] is not None
    assert 0 < seen[2] <= 60.0
