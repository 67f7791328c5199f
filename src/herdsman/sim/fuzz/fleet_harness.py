"""Run one fleet scenario: real supervisors as fleet members, one shared simulated ledger.

Each member is the real :class:`~herdsman.runtime.supervisor.Supervisor`
with a real :class:`~herdsman.runtime.fleet_member.FleetMember`, on its own
connection to one :class:`~herdsman.sim.fleet_store.SimFleet`, with its own
state directory, fake runner and trace, and a modelled fence keeper
(:class:`~herdsman.sim.fuzz.fleet_agents.SimFence`). All of them run in one
trio run under one ``MockClock`` that jumps whenever every task waits.

The fault: at the scenario's moment, a member is killed as SIGKILL kills a
process. Its connection is cut off first (nothing it records afterwards
reaches the ledger), its agents are handed to the fence model (they live on until
its keeper kills them), and its tasks are cancelled. A task of it already
scheduled at that instant runs on to its next checkpoint, where the cancel
reaches it; whatever it does meanwhile reaches nothing, not even an agent: the
fake runner of a killed member spawns none. Its lease runs on in
the ledger until it lapses, and another member's renewal expires it after
the margin: its runs become ``lost``, and their conversations' next runs
start elsewhere. A member may also be cut off from the ledger for a while
(its connection's calls fail): past its lease, its fence falls while it
lives. The checks are made on the agents' real lifetimes
(``fleet_agents.py``), and on the ledger at the end: every run ended.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing

from herdsman.config import load_config_text
from herdsman.runtime.fleet_member import FleetMember
from herdsman.runtime.ledger import Inline
from herdsman.runtime.runner import Outcome, ProcessOutcome, ProcessSpec, RunCancel
from herdsman.runtime.store import NewRun, StoreError
from herdsman.runtime.supervisor import NotAdmitting, RunConflict, RunNotFound, Supervisor
from herdsman.sim.fleet_store import SimFleet, SimFleetStore
from herdsman.sim.fuzz.fleet_agents import Agents, Life, SimFence
from herdsman.sim.fuzz.fleet_scenario import STAGGER, FleetScenario
from herdsman.sim.fuzz.invariants import Violation
from herdsman.sim.trio_internals import shuffle_trio
from herdsman.trace import TraceWriter

__all__ = ["FleetVerdict", "run_fleet_scenario"]

#: The simulated clock's start (unix seconds), as the single-supervisor fuzzer's.
STARTED_AT = 1_795_000_000.0
#: How long (simulated) after its kill a member's tasks may take to unwind.
_UNWIND = 60.0
#: The unit of the moment a stopped agent takes to die (simulated seconds).
_DYING = 1e-6
#: Room after the last run could have ended (simulated seconds): leases, margins, polls.
_SLACK = 120.0


@attrs.frozen
class FleetVerdict:
    """How a fleet scenario went."""

    scenario: FleetScenario
    violations: tuple[Violation, ...]
    #: Every agent's life: ``(run, member, start, end)``, by start, then run.
    lives: tuple[tuple[str, int, float, float | None], ...]
    #: Each member's trace, by member.
    traces: tuple[str, ...]
    #: The ledger at the end: each run's ``(id, status, reason)``, by ``seq``.
    ledger: tuple[tuple[str, str, str | None], ...]
    span: float
    wall_seconds: float

    @property
    def failed(self) -> bool:
        """Whether an invariant did not hold."""
        return bool(self.violations)


def run_fleet_scenario(scenario: FleetScenario, *, wake_seed: int | None = None) -> FleetVerdict:
    """Run ``scenario`` and check it; the same verdict for the same scenario in any process.

    ``wake_seed`` seeds trio's wake-up order (the scenario's seed by default):
    the verdict must not depend on it.
    """
    shuffle_trio(scenario.seed if wake_seed is None else wake_seed)
    began = time.perf_counter()
    clock = trio.testing.MockClock(autojump_threshold=0)
    fleet = _Fleet(scenario)
    trio.run(fleet.run, clock=clock)
    return FleetVerdict(
        scenario,
        tuple(fleet.violations),
        tuple((life.run_id, life.member, life.start, life.end) for life in fleet.agents.in_order()),
        tuple(member.trace.getvalue() for member in fleet.members),
        fleet.ledger_at_end,
        fleet.span,
        time.perf_counter() - began,
    )


class _Trace(io.StringIO):
    """A member's trace file: kept as text, closed for good once the member is killed."""

    def __init__(self) -> None:
        super().__init__()
        self.live = True

    def write(self, text: str) -> int:
        return super().write(text) if self.live else len(text)


@attrs.define
class _Member:
    """One member: its supervisor, its connection, its fence, the scope that kills it."""

    index: int
    supervisor: Supervisor
    store: SimFleetStore
    fence: SimFence
    trace: _Trace
    scope: trio.CancelScope
    dead: bool = False


class _Fleet:
    """One scenario's run: the ledger, the members, the agents, the fault and the checks."""

    def __init__(self, scenario: FleetScenario) -> None:
        self.scenario = scenario
        self.ledger = SimFleet(self.wall, trio.current_time)
        self.agents = Agents(fence=scenario.fence)
        self.members: list[_Member] = []
        self.violations: list[Violation] = []
        self.ledger_at_end: tuple[tuple[str, str, str | None], ...] = ()
        self.span = 0.0
        self._durations = {run["id"]: float(run["duration"]) for run in scenario.runs}
        self._conversations = {run["id"]: run.get("conversation") for run in scenario.runs}
        self._order = {run["id"]: order for order, run in enumerate(scenario.runs)}

    @staticmethod
    def wall() -> float:
        """The simulated unix time: the ledger server's clock."""
        return STARTED_AT + trio.current_time()

    async def run(self) -> None:
        """Start the members, deliver the runs and the kill, wait for the queue to drain, check."""
        scenario = self.scenario
        async with trio.open_nursery() as nursery:
            for index in range(scenario.members):
                await trio.sleep_until(index * STAGGER)
                self.members.append(await self._start(index, nursery))
            if scenario.kill is not None:
                nursery.start_soon(self._kill_at, scenario.kill, nursery)
            nursery.start_soon(self._cancels, nursery)
            if scenario.partition is not None:
                nursery.start_soon(self._partition, scenario.partition)
            for run in scenario.runs:
                await trio.sleep_until(float(run["t"]))
                await self._submit(run)
            horizon = self._horizon()
            while trio.current_time() < horizon and not self._drained():
                await trio.sleep(1.0)
            self.span = trio.current_time()
            self._check_end(horizon)
            for member in self.members:
                # Stopped where they stand: what they still record (a finish
                # retried through a partition, say) goes nowhere, and is taken.
                member.trace.live = False
                member.store.unreachable = False
                member.store.cut_off()
                member.scope.cancel()
            nursery.cancel_scope.cancel()

    def _horizon(self) -> float:
        runs = self.scenario.runs
        work = sum(float(run["duration"]) for run in runs)
        return max(float(run["t"]) for run in runs) + work + _SLACK

    def _drained(self) -> bool:
        return all(
            record.is_terminal
            for record in self.ledger.runs.records()
            if record.id in self._durations
        ) and len(self.ledger.runs.records()) >= len(self._durations)

    def _check_end(self, horizon: float) -> None:
        records = self.ledger.runs.records()
        self.ledger_at_end = tuple((r.id, r.status.value, r.reason) for r in records)
        self.violations += self.agents.violations(self.scenario.cap, trio.current_time())
        ended = {
            record.id: record.finished_at - STARTED_AT
            for record in records
            if record.finished_at is not None
        }
        self.violations += self.agents.outlived(ended)
        known = {record.id for record in records}
        for run in self.scenario.runs:
            if run["id"] not in known:
                self.violations.append(
                    Violation("liveness", horizon, f"run {run['id']} never reached the ledger")
                )
        for record in records:
            if not record.is_terminal:
                self.violations.append(
                    Violation(
                        "liveness",
                        trio.current_time(),
                        f"run {record.id} still {record.status.value} at the end",
                    )
                )

    # -- members -----------------------------------------------------------------

    async def _start(self, index: int, nursery: trio.Nursery) -> _Member:
        scenario = self.scenario
        path = Path(f"/herdsman-sim/member-{index}.toml")
        config = load_config_text(scenario.config(index), path, environ={}).config
        store = self.ledger.join(
            f"m{index}",
            host=f"member-{index}",
            pid=1000 + index,
            lease=scenario.lease,
            margin=scenario.margin,
        )
        fence = SimFence(index, store.lease_end_local, self.agents)
        sink = _Trace()
        trace = TraceWriter(
            Path(f"/herdsman-sim/member-{index}/traces"),
            max_bytes=1 << 62,
            sink=sink,
            config={},
            clock=trio.current_time,
            wall=lambda: dt.datetime.fromtimestamp(self.wall(), dt.UTC),
        )
        supervisor = Supervisor(
            config,
            store,
            execute=_Runner(self, index).execute,
            wall=self.wall,
            trace=trace,
            run_sync=Inline(store.apply_one),
            stop_orphans=False,
            resolve_program=lambda name: name,
            fleet=FleetMember(store, fence),
        )
        trace.open()
        scope = trio.CancelScope()

        async def live(
            *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
        ) -> None:
            with scope:
                await supervisor.run(task_status=task_status)
            if not scope.cancel_called:
                self._exited(member)

        member = _Member(index, supervisor, store, fence, sink, scope)
        await nursery.start(live)
        return member

    def _exited(self, member: _Member) -> None:
        """A member stopped by itself (its fence fell, its ledger failed): as ``herdsman run``
        exits, its keeper's pipe closes (any agent left dies now), then it leaves the fleet."""
        self.agents.fence_fired(member.index, trio.current_time())
        with contextlib.suppress(StoreError):
            member.store.leave()

    async def _submit(self, run: Mapping[str, Any]) -> None:
        """Submit ``run`` to its member or, refused there (dead, stopped, cut off from the
        ledger), to the next one, as a client tries another member."""
        new = NewRun(
            id=run["id"],
            provider="demo",
            prompt="(fleet fuzz)",
            conversation=run.get("conversation"),
        )
        wanted, members, refusals = int(run["member"]), self.members, []
        for step in range(len(members)):
            member = members[(wanted + step) % len(members)]
            if member.dead or member.supervisor.finished.is_set():
                continue
            try:
                await member.supervisor.submit(new)
            except (NotAdmitting, StoreError) as error:
                refusals.append(f"member {member.index}: {error}")
                continue
            return
        self.violations.append(
            Violation(
                "submit",
                trio.current_time(),
                f"{run['id']} taken by no member: {'; '.join(refusals) or 'none alive'}",
            )
        )

    async def _cancels(self, nursery: trio.Nursery) -> None:
        """Each cancel at its moment, through its member (the next one alive, if dead)."""
        for cancel in self.scenario.cancels:
            await trio.sleep_until(float(cancel["t"]))
            member = self._alive(int(cancel["member"]))
            if member is not None:
                nursery.start_soon(self._cancel, member, str(cancel["run"]))

    @staticmethod
    async def _cancel(member: _Member, run_id: str) -> None:
        # Not found: not submitted yet; a conflict: it had ended. A client's
        # everyday answers, not findings.
        with contextlib.suppress(RunNotFound, RunConflict, NotAdmitting, StoreError):
            await member.supervisor.cancel(run_id, "cancelled by the fleet fuzzer's client")

    def _alive(self, wanted: int) -> _Member | None:
        members = self.members
        for step in range(len(members)):
            member = members[(wanted + step) % len(members)]
            if not member.dead and not member.supervisor.finished.is_set():
                return member
        return None

    async def _partition(self, partition: Mapping[str, Any]) -> None:
        """Cut a member off from the ledger for a while (its own calls fail; it lives on)."""
        await trio.sleep_until(float(partition["t"]))
        member = self.members[int(partition["member"])]
        member.store.unreachable = True
        try:
            await trio.sleep(float(partition["seconds"]))
        finally:
            member.store.unreachable = False

    async def _kill_at(self, kill: Mapping[str, Any], nursery: trio.Nursery) -> None:
        await trio.sleep_until(float(kill["t"]))
        join_after = kill.get("join_after")
        if join_after is not None:
            nursery.start_soon(self._join_at, float(kill["t"]) + float(join_after), nursery)
        member = self.members[int(kill["member"])]
        # As SIGKILL: nothing more of it reaches the ledger or its trace, its
        # agents run on (until its fence keeper kills them), its tasks stop.
        member.dead = True
        member.trace.live = False
        member.store.cut_off()
        self.agents.member_died(member.index, member.fence)
        member.scope.cancel()
        with trio.move_on_after(_UNWIND):
            await member.supervisor.finished.wait()
        if not member.supervisor.finished.is_set():
            self.violations.append(
                Violation(
                    "killed member did not unwind",
                    trio.current_time(),
                    f"member {member.index}'s tasks still ran {_UNWIND:g}s after its kill",
                )
            )

    async def _join_at(self, at: float, nursery: trio.Nursery) -> None:
        """A new member joins at ``at``, on a state directory of its own."""
        await trio.sleep_until(at)
        self.members.append(await self._start(len(self.members), nursery))

    def member(self, index: int) -> _Member | None:
        """Member ``index``, once started."""
        return self.members[index] if index < len(self.members) else None


class _Runner:
    """One member's fake runner: agents that work their run's duration, told to :class:`Agents`."""

    def __init__(self, fleet: _Fleet, index: int) -> None:
        self._fleet = fleet
        self._index = index

    async def execute(
        self,
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> ProcessOutcome:
        """Spawn the run's agent; return when its work is done or its member stops it."""
        fleet, index = self._fleet, self._index
        run_id = spec.env["HERDSMAN_RUN_ID"]
        member = fleet.member(index)
        if member is not None and member.dead:
            # A task trio had already scheduled when the member was killed
            # runs on to its next checkpoint, where the cancel reaches it
            # (docs/simulator.md, "Fleets"). A killed process spawns nothing:
            # this one stops here, at a checkpoint, before any agent exists.
            await trio.sleep_forever()
        task_status.started(0)
        life = fleet.agents.spawned(
            run_id, index, fleet._conversations.get(run_id), fleet._durations.get(run_id, 1.0)
        )
        stopped: list[str] = []
        done = trio.Event()

        def on_cancel(reason: str) -> None:
            stopped.append(reason)
            done.set()

        if cancel is not None and cancel.reason is not None:
            on_cancel(cancel.reason)
        elif cancel is not None:
            cancel._attach(on_cancel)
        try:
            with trio.move_on_after(life.natural_end - trio.current_time()):
                await done.wait()
            if stopped:
                # An agent takes a moment to die, a moment of its own: agents
                # stopped at once (a member's forced stop) end one by one, in
                # the runs' order, never in trio's wake-up order.
                await trio.sleep((1 + fleet._order.get(run_id, 0)) * _DYING)
        except BaseException:
            self._lost(life)
            raise
        finally:
            if cancel is not None:
                cancel._detach()
        fleet.agents.ended(life)
        if stopped:
            return _outcome(Outcome.CANCELLED, None, stopped[0])
        return _outcome(Outcome.SUCCEEDED, 0, None)

    def _lost(self, life: Life) -> None:
        """The member's task was cancelled: alive, it stopped its agent; killed, it did not."""
        member = self._fleet.member(self._index)
        if member is None or not member.dead:
            self._fleet.agents.ended(life)


def _outcome(status: Outcome, exit_code: int | None, reason: str | None) -> ProcessOutcome:
    return ProcessOutcome(
        status=status,
        exit_code=exit_code,
        reason=reason,
        limit=None,
        result="(simulated)" if status is Outcome.SUCCEEDED else None,
        session_id=None,
        excerpt="",
        usage_limit=None,
    )
