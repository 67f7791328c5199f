"""A fleet's members' traces replayed together: real supervisors on one simulated ledger.

Each member is the real :class:`~herdsman.runtime.supervisor.Supervisor`
with a real :class:`~herdsman.runtime.fleet_member.FleetMember`, on its own
connection to one :class:`~herdsman.sim.fleet_store.SimFleet`, with its own
trace, all under one ``MockClock`` driven by the replay's driver
(:func:`herdsman.sim.replay.drive`). The members' traces are aligned on
their headers' ``started_at``.

What comes from outside the fleet is delivered at its recorded moment, to
the member that recorded it: each member's start, the submits it took
(``fleet_submit``, ``skip``), the cancels asked of it (``cancel``,
``fleet_cancel``), its reloads and its shutdown; each run ends when its
holder's trace says it did. What one member learns of the others comes
through the ledger, at its polls, and a poll is the one place where the
real fleet's timing decided something: which runs a member found queued
depended on the others' claims, milliseconds apart. So a member's polls
happen when its trace says one changed its queue (``poll``; or when the
member decided on the runs it took, if later: ``fleet_members``), and only
then: at any other moment (its timer, its own submit's poke) the replay's
ledger answers its poll as a ledger out of reach would, and the member
tries again at its next one, as it did in the recording, where such a poll
changed nothing (docs/simulator.md, "A fleet's traces together").
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.config import LoadedConfig
from herdsman.runtime.fleet_member import FleetMember
from herdsman.runtime.git.fake import FakeGit
from herdsman.runtime.ledger import Inline
from herdsman.runtime.metrics import Uncounted
from herdsman.runtime.store import RunRecord, StoreError
from herdsman.runtime.store.fleet import ClaimResult, ClaimRules, Poll, Refusal
from herdsman.runtime.supervisor import NotAdmitting, RunConflict, RunNotFound, Supervisor
from herdsman.sim.bounds import WALL_LIMIT, run_watched
from herdsman.sim.collector import young_collections_rarer
from herdsman.sim.fleet_members import (
    Member,
    _Input,
    _inputs,
    _later_notes,
    _merged,
    read_member,
)
from herdsman.sim.fleet_store import SimFleet, SimFleetStore
from herdsman.sim.replay import (
    ARRIVAL,
    Driver,
    deliver_arrival,
    drive,
    new_run,
)
from herdsman.sim.trio_internals import mock_time, plain_instruments, shuffle_trio
from herdsman.sim.workload import (
    Arrival,
    config_from_trace,
)
from herdsman.trace import TraceWriter

__all__ = ["FleetReplayResult", "Member", "fleet_replay", "fleet_summary", "read_member"]

log = logging.getLogger("herdsman")


@attrs.frozen
class FleetReplayResult:
    """Each member's simulated trace, and what the summary line reports."""

    traces: tuple[str, ...]
    runs: int
    span: float
    wall_seconds: float
    #: What the replay could not reproduce exactly: one line each, first cause first.
    notes: tuple[str, ...] = ()


def fleet_summary(result: FleetReplayResult) -> str:
    """The line printed on stderr after a fleet's replay (its notes follow, one a line)."""
    rate = result.runs / result.wall_seconds if result.wall_seconds > 0 else math.inf
    line = (
        f"replayed {result.runs} runs of {len(result.traces)} fleet members together over"
        f" {result.span:.1f} simulated seconds in {result.wall_seconds:.2f} s wall"
        f" ({rate:,.0f} runs per wall second)"
    )
    return "\n".join((line, *result.notes))


# -- what is delivered, when ---------------------------------------------------------


class _NotRecorded(StoreError):
    """A poll the recording did not trace: it changed nothing there, so nothing here."""


#: A poll that changed nothing (the recording traces none): a member's start-up poll so.
_NOTHING: Mapping[str, Any] = {"runs": [], "left": [], "cancels": []}


class _RecordedPolls(SimFleetStore):
    """A member's connection whose polls answer at the moments its trace recorded one, with
    what each recorded poll learned, as far as the replayed ledger agrees.

    The recorded poll read the ledger a moment before its line was written:
    a submit committed meanwhile on another member was not in it. So a
    recorded poll takes, of the runs queued now, those it took in the
    recording; sees leave those it saw leave, if they have; brings the
    cancels it brought. Its cursor moves past what it took, never past a
    run it left for a later poll. What the replayed ledger lacks of it is
    found afterwards (``_later_notes``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The recorded polls due, oldest first: what each learned.
        self.due: deque[Mapping[str, Any]] = deque()
        #: Each run's recorded claims by this member, in order: ``start`` (won)
        #: or the refusal (``gone``, ``lane``, ``cap``); None: not recorded.
        self.claims: dict[str, deque[str]] | None = None

    def claim_many(
        self,
        items: Sequence[tuple[str, str | None]],
        now: float,
        rules: ClaimRules | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> ClaimResult:
        """Claim as recorded: a claim the recording won goes to the ledger, which decides;
        one it lost is refused as it was, the ledger untouched.

        Which member won a run was decided by milliseconds (a claim commits
        some time after the poll or the finish that allowed it, the longer
        the busier the machine), which the replay, deciding at once, cannot
        reproduce. A claim of a run this member never claimed again in the
        recording is refused as gone: it learned then that the run had left.
        """
        if self.free or self.claims is None:
            return super().claim_many(items, now, rules, clock=clock)
        imposed: dict[str, Refusal] = {}
        for run_id, _ in items:
            recorded = self.claims.get(run_id)
            outcome = recorded.popleft() if recorded else "gone"
            if outcome != "start":
                imposed[run_id] = _REFUSALS[outcome]
        result = super().claim_many(
            [item for item in items if item[0] not in imposed], now, rules, clock=clock
        )
        refused = dict(result.refused)
        return ClaimResult(
            result.claimed,
            [
                (run_id, imposed.get(run_id) or refused[run_id])
                for run_id, _ in items
                if run_id in imposed or run_id in refused
            ],
        )

    #: A what-if: every poll answers from the ledger, whenever it comes.
    free = False

    def poll(self, cursor: int, queued: Sequence[str] = ()) -> Poll:
        """The recorded poll due, answered from the ledger; else refused, as out of reach."""
        if self.free:
            return super().poll(cursor, queued)
        if not self.due:
            raise _NotRecorded("not a poll the recording traced")
        recorded = self.due.popleft()
        answer = super().poll(cursor, queued)
        took, left, cancels = (set(recorded[key]) for key in ("runs", "left", "cancels"))
        marks = self.fleet.marks

        def place(run: RunRecord) -> int:
            return max(run.seq, marks.get(run.id, 0))

        runs = [run for run in answer.runs if run.id in took]
        later = [place(run) for run in answer.runs if run.id not in took]
        moved = max([cursor, *(place(run) for run in runs)])
        if later:
            moved = max(cursor, min(moved, min(later) - 1))
        return Poll(
            runs,
            moved,
            [cancel for cancel in answer.cancels if cancel[0] in cancels],
            [run_id for run_id in answer.left if run_id in left],
        )


#: A recorded refusal (``claim_refused``), as the ledger gives it.
_REFUSALS: Mapping[str, Refusal] = {
    "gone": Refusal.GONE,
    "lane": Refusal.LANE_BUSY,
    "cap": Refusal.PROVIDER_CAP,
}


class _QuietUnrecorded(logging.Filter):
    """Drops the member's log line for a poll refused as unrecorded (not news to anyone)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(isinstance(arg, _NotRecorded) for arg in record.args or ())


@attrs.define
class _Live:
    """A member replayed: its supervisor, connection and trace, once it joined."""

    supervisor: Supervisor
    store: _RecordedPolls
    out: io.StringIO
    text: str | None = None  # taken when the input was over, if it still ran then
    #: Cancelled to kill the member, as SIGKILL (its trace just ends).
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    killed: bool = False


class _Fleet:
    """The members, their ledger, and what the driver delivers to them."""

    def __init__(
        self,
        members: Sequence[Member],
        configs: Sequence[LoadedConfig],
        offsets: Sequence[float],
        inputs: Sequence[_Input],
        driver: Driver,
        *,
        free: bool = False,
    ) -> None:
        self.members = members
        self.free = free
        # Traces that record their polls record their refused claims too.
        self.claims_recorded = any(e.event == "poll" for m in members for e in m.events)
        self.configs = configs
        self.offsets = offsets
        self.inputs = inputs
        self.driver = driver
        self.base = min(member.started_at for member in members)
        self.live: list[_Live | None] = [None] * len(members)
        self.runs = 0
        self.finished = trio.Event()  # every member that joined has stopped
        self.git = FakeGit()
        # Plain functions, not bound methods: a killed member's connection
        # deep-copies the ledger, clocks and all (functions are copied as
        # themselves; a bound method would drag this whole replay along).
        driver = self.driver

        def wall() -> float:
            return self.base + driver.now()

        def local() -> float:
            return driver.now()

        self.ledger = SimFleet(wall, local)
        self.span = 0.0
        self.last: _Input | None = None
        self._nursery: trio.Nursery | None = None
        self._next = 0

    def wall(self) -> float:
        """The simulated unix time: the ledger server's clock."""
        return self.base + self.driver.now()

    # The composite the driver reads (``Driven``).
    @property
    def account_recheck_at(self) -> float | None:
        """The earliest of the members' times to look at their accounts again."""
        times = [
            at
            for live in self.live
            if live is not None and not live.supervisor.finished.is_set()
            for at in (live.supervisor.account_recheck_at,)
            if at is not None
        ]
        return min(times) if times else None

    def push_next(self) -> None:
        order = self._next
        if order < len(self.inputs):
            self.driver.push(self.inputs[order].t, ARRIVAL, order, self._deliver)

    async def _deliver(self) -> None:
        item = self.inputs[self._next]
        self._next += 1
        self.last = item
        live = self.live[item.member]
        if item.kind == "join":
            await self._join(item.member)
        elif item.kind == "inject":
            self._inject(item.fields["run"])
        elif item.kind == "kill" and live is not None and not live.supervisor.finished.is_set():
            # As SIGKILL: nothing more of it reaches its trace or the ledger
            # (its dying tasks write to a copy nobody reads); its lease runs
            # on until it lapses and another member expires it.
            live.text = live.out.getvalue()
            live.killed = True
            live.store.cut_off()
            live.scope.cancel()
        elif live is None or live.supervisor.finished.is_set():
            pass  # stopped: nothing reaches it any more
        elif item.kind == "poll":
            live.store.due.append(item.fields)
            fleet = live.supervisor.fleet
            assert fleet is not None
            fleet.poke()
        elif item.kind in ("submit", "skip"):
            await self._submit(live.supervisor, item.fields["run"], item.kind)
        elif item.kind == "cancel":
            # Ended, or never here, in this replay: nothing to cancel.
            with contextlib.suppress(RunNotFound, RunConflict, NotAdmitting, StoreError):
                await live.supervisor.cancel(item.fields["run_id"])
        else:
            await deliver_arrival(live.supervisor, Arrival(item.t, item.kind, item.fields))
        self.push_next()

    async def _submit(self, supervisor: Supervisor, run: Mapping[str, Any], kind: str) -> None:
        new = new_run(run)
        try:
            (result,) = await supervisor.submit_each([(new, "skip" if kind == "skip" else "queue")])
            _, created = result.unwrap()
        except NotAdmitting:
            return
        self.runs += created

    def _inject(self, run: Mapping[str, Any]) -> None:
        """A run submitted to a member not given: into the ledger as that member put it."""
        if self.ledger.runs.get(run["id"]) is None:
            self.ledger.runs.submit(new_run(run), self.wall())
            self.runs += 1

    async def _join(self, index: int) -> None:
        assert self._nursery is not None
        loaded = self.configs[index]
        # Made again inside the fake filesystem (see replay._replay).
        loaded = config_from_trace(_config_json(loaded), "configuration")
        config = loaded.config
        for repo in config.repos:
            if not repo.path.exists():
                repo.path.mkdir(parents=True, exist_ok=True)
                self.git.init_repository(repo.path, {"README.md": "a simulated repository\n"})
        ledger = self.ledger
        store = _RecordedPolls(
            ledger,
            member_id=f"m{index}",
            host=self.members[index].name,
            pid=index,
            lease=config.fleet.lease.total_seconds(),
        )
        # The start-up poll, made before anything else is traced (traced
        # only if it took anything).
        startup = self.members[index].startup
        store.due.append(_NOTHING if startup is None else startup.fields)
        store.free = self.free
        if self.claims_recorded:
            store.claims = _claims(self.members[index])
        out = io.StringIO()
        now = self.driver.now
        trace = TraceWriter(
            Path(f"/herdsman-sim/member-{index}/traces"),
            max_bytes=1 << 62,
            sink=out,
            config=_config_json(loaded),
            clock=now,
            wall=lambda: dt.datetime.fromtimestamp(self.wall(), dt.UTC),
        )
        supervisor = Supervisor(
            config,
            store,
            execute=self.driver.execute,
            wall=self.wall,
            trace=trace,
            metrics=Uncounted(),
            run_sync=Inline(store.apply_one),
            git=self.git,
            loaded=loaded,
            stop_orphans=False,
            resolve_program=lambda name: name,
            fleet=FleetMember(store),
        )
        trace.open()
        live = _Live(supervisor, store, out)
        self.live[index] = live

        async def run(
            *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
        ) -> None:
            with live.scope:
                await supervisor.run(task_status=task_status)
            trace.close()
            if not live.killed:
                # As ``herdsman run`` exits: leaving waives the margin of its lease.
                with contextlib.suppress(StoreError):
                    store.leave()
            store.close()
            if all(each is None or each.supervisor.finished.is_set() for each in self.live):
                self.finished.set()

        await self._nursery.start(run)

    async def run(self, clock: trio.testing.MockClock) -> float:
        """Drive the members through the inputs; the simulated span (when they were over)."""
        plain_instruments()
        self.driver.now = mock_time(clock)
        end = max(
            (offset + (m.events[-1].t if m.events else 0.0))
            for m, offset in zip(self.members, self.offsets, strict=True)
        )
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.push_next()
            # The recordings' end: timers (polls refused, leases) act until then.
            self.driver.push(end, ARRIVAL, len(self.inputs), lambda: None)
            self.driver.driving = True
            await drive(self.driver, self, clock)
            self.driver.driving = False
            self.driver.moves += 1
            self.span = trio.current_time()
            for live in self.live:
                if live is not None and not live.supervisor.finished.is_set():
                    # What stopping it traces was never recorded.
                    live.text = live.out.getvalue()
                    live.supervisor.request_shutdown()
            if any(live is not None for live in self.live):
                await self.finished.wait()
            nursery.cancel_scope.cancel()
        return self.span

    def where(self) -> str:
        item = self.last
        if item is None:
            return "before the first member joined"
        member = self.members[item.member].name
        return f"the last event delivered: {item.kind} ({member}:{item.line:g}) at t={item.t:.3f}"


def _claims(member: Member) -> dict[str, deque[str]]:
    """Each run's claims by ``member`` as its trace recorded them, in order."""
    claims: dict[str, deque[str]] = {}
    for event in member.events:
        if event.event == "start":
            claims.setdefault(event.fields["run_id"], deque()).append("start")
        elif event.event == "claim_refused":
            claims.setdefault(event.fields["run_id"], deque()).append(event.fields["refusal"])
    return claims


def _config_json(loaded: LoadedConfig) -> dict[str, Any]:
    from herdsman.config.report import config_as_json  # noqa: PLC0415

    return config_as_json(loaded.config)


def fleet_replay(
    members: Sequence[Member],
    configs: Sequence[LoadedConfig],
    *,
    what_if: bool = False,
    seed: int | None = None,
    wall_limit: float | None = WALL_LIMIT,
) -> FleetReplayResult:
    """Replay ``members`` together, each under its configuration in ``configs``.

    ``what_if``: the configurations are not the recorded ones (notes say so).
    Notes (``FleetReplayResult.notes``) say, one line each, what the replay
    could not reproduce exactly: the traces of a member missing (its runs go
    into the ledger where another member polled them), then the first poll
    that learned otherwise, and the first run no member given started.
    Times in notes are seconds since the earliest member's header.

    The same input always gives the same traces; ``seed`` reshuffles trio's
    wake-up order to prove it. Bounded as :func:`herdsman.sim.replay.replay`.
    """
    if seed is not None:
        shuffle_trio(seed)
    began = time.perf_counter()
    base = min(member.started_at for member in members)
    offsets = [member.started_at - base for member in members]
    inputs, notes, killed = _inputs(members, offsets)
    missing = bool(notes)
    notes += killed
    if what_if:
        # A what-if decides for itself: its members poll on their own timers
        # and at their submits, and keep its configuration (the recorded
        # reloads would quietly put the recorded one back).
        reloads = sum(1 for item in inputs if item.kind == "reload")
        inputs = [item for item in inputs if item.kind not in ("reload", "poll")]
        notes.insert(
            0,
            (
                0.0,
                "a what-if configuration is given: the members poll on their own timers, not"
                " at their recorded polls"
                + (f", and the traces' {reloads} reload(s) are not replayed" if reloads else ""),
            ),
        )
    driver = Driver(_merged(members, offsets))
    fleet = _Fleet(members, configs, offsets, inputs, driver, free=what_if)
    quiet = _QuietUnrecorded()
    log.addFilter(quiet)
    try:
        with Patcher(), young_collections_rarer():
            run_watched(
                fleet.run,
                progress=lambda: driver.moves,
                where=fleet.where,
                wall_limit=wall_limit,
                grace=max(c.config.supervisor.shutdown_grace.total_seconds() for c in configs),
            )
    finally:
        log.removeFilter(quiet)
    traces = tuple(
        "" if live is None else live.text if live.text is not None else live.out.getvalue()
        for live in fleet.live
    )
    if missing:
        cause = "a member is missing from the traces given (the note on the first such run)"
    elif killed:
        cause = "a member was killed, and its lease's expiry is in no trace (the note on it)"
    elif what_if:
        cause = "the what-if configuration decided otherwise"
    else:
        cause = (
            "the members raced closer together than their traces can order (a poll's line"
            " is written after its read, a claim's after its commit)"
        )
    later = sorted(
        _later_notes(
            members, offsets, traces, driver.executions.defaulted, cause, polls=not what_if
        )
    )
    return FleetReplayResult(
        traces,
        fleet.runs,
        fleet.span,
        time.perf_counter() - began,
        tuple(f"t={t:.3f} {text}" for t, text in (*notes, *later)),
    )
