"""Full-fidelity replay: the real supervisor on a fake clock, disk, store, git and runner.

Determinism by construction. One driver task owns every external event — an
arrival from the trace, the end of a fake run — in a heap keyed by ``(time,
kind, sequence)``, where the sequence comes from the trace (arrival order,
attempt number), never from which task woke first. The driver delivers one
event at a time and then waits until every task is blocked
(``trio.testing.wait_all_tasks_blocked``, or riding along with the tasks
the event woke until none is left to run) before the next, so whatever one
event sets off has finished before the next begins. Between events it moves
the ``MockClock`` itself, to the next event or to the supervisor's own next
timer if that comes first (so a timer due at an event's instant acts before
it). Nothing is decided by trio's wake-up order, which ``--seed`` reshuffles
to prove it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import heapq
import io
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio
import trio.testing
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.config import Config, LoadedConfig
from herdsman.runtime.git.fake import FakeGit
from herdsman.runtime.ledger import Inline, inline
from herdsman.runtime.metrics import Uncounted
from herdsman.runtime.runner import (
    ProcessOutcome,
    ProcessSpec,
    RunCancel,
)
from herdsman.runtime.store import MemoryStore, NewRun, Store
from herdsman.runtime.supervisor import (
    NotAdmitting,
    RunConflict,
    RunNotFound,
    Supervisor,
    UnknownAccount,
)
from herdsman.sim.bounds import WALL_LIMIT, run_watched
from herdsman.sim.fake_end import fake_end
from herdsman.sim.result import ReplayResult, recording_ends, summary
from herdsman.sim.trio_internals import (
    any_woken,
    checkpoints,
    mock_time,
    next_deadline,
    plain_instruments,
    runnable,
    settler,
    shuffle_trio,
    tasks,
)
from herdsman.sim.workload import (
    CARRIED_REST,
    DEFAULT_DURATION,
    Arrival,
    Attempt,
    Executions,
    Workload,
    config_from_trace,
)
from herdsman.trace import TraceWriter

__all__ = [
    "ARRIVAL",
    "DEFAULT_DURATION",
    "Driven",
    "Driver",
    "ReplayResult",
    "deliver_arrival",
    "drive",
    "new_run",
    "replay",
    "shuffle_trio",
    "summary",
]

# Event kinds in the order they go at one instant: a run ending frees its
# slot before an arrival at the same moment is looked at, as in a recording
# where the finish was written first.
END, ARRIVAL = 0, 1


#: What an event does when delivered: a coroutine to await (an arrival
#: handed to the supervisor), or nothing more (a run's end wakes its task).
Action = Callable[[], Awaitable[None] | None]


class Driver:
    """The heap of external events, and the fake runner that feeds it."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._heap: list[tuple[float, int, int, int, Action]] = []
        self._pushes = 0
        self.executions = Executions(workload)
        # One outcome per way an attempt can end on its own: outcomes are
        # frozen, and building one per run cost more than the rest of the
        # fake runner's bookkeeping.
        self._outcomes: dict[tuple[str, int | None, float | None], ProcessOutcome] = {}
        #: Whether the driver is delivering events (it is not once the input is over).
        self.driving = False
        #: The time now: the replay reads its ``MockClock`` through :func:`mock_time`.
        self.now: Callable[[], float] = trio.current_time
        #: Events delivered (and one more once the input is over): the replay's
        #: watch for a spin or a stall (herdsman.sim.bounds) reads progress here.
        self.moves = 0
        #: The last event delivered: ``(time, kind, order)``, what a stuck replay names.
        self.last: tuple[float, int, int] | None = None

    def push(self, t: float, kind: int, order: int, action: Action) -> None:
        # ``order`` breaks ties within a kind; the counter only keeps tuples
        # comparable (it never decides: equal (t, kind, order) cannot happen).
        self._pushes += 1
        heapq.heappush(self._heap, (t, kind, order, self._pushes, action))

    def next_time(self) -> float | None:
        """When the earliest event is due, if there is one."""
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, Action] | None:
        if not self._heap:
            return None
        t, kind, order, _, action = heapq.heappop(self._heap)
        self.moves += 1
        self.last = t, kind, order
        return t, action

    async def execute(
        self,
        spec: ProcessSpec,
        *,
        cancel: RunCancel | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> ProcessOutcome:
        """The fake runner: ends when the driver says the recorded duration is up."""
        run_id = spec.env["HERDSMAN_RUN_ID"]
        plan = self.workload.plans.get(run_id)
        index = plan.index if plan is not None else len(self.workload.plans)
        attempt = self.executions.next(run_id)
        task_status.started(0)
        done = trio.Event()
        stopped: list[str] = []
        if cancel is not None:
            if cancel.cancelled:
                return fake_end(Attempt(0.0, "cancelled"), cancel.reason)

            def on_cancel(reason: str) -> None:
                stopped.append(reason)
                if self.driving:
                    # Stopped now, but ended by the driver like any run's end:
                    # a forced shutdown stops many at once, and their ends
                    # must be recorded in arrival order, not trio's wake order.
                    self.push(self.now(), END, index, done.set)
                else:
                    done.set()

            cancel._attach(on_cancel)

        # Its end wakes this task and awaits nothing: no coroutine per run.
        # One the recording never saw end (it was cut short) never ends.
        end = attempt.end(self.now())
        if end != math.inf:
            self.push(end, END, index, done.set)
        try:
            await done.wait()
        finally:
            if cancel is not None:
                cancel._detach()
        if stopped:
            return fake_end(Attempt(0.0, "cancelled"), stopped[0])
        if attempt.usage is not None or attempt.limit is not None:
            return fake_end(attempt, None)  # its own: what its agent's stream said
        key = (attempt.outcome, attempt.exit_code, attempt.resets_at)
        ended = self._outcomes.get(key)
        if ended is None:
            ended = self._outcomes[key] = fake_end(attempt, None)
        return ended


def replay(
    workload: Workload,
    loaded: LoadedConfig,
    *,
    seed: int | None = None,
    store: Store | None = None,
    wall_limit: float | None = WALL_LIMIT,
) -> ReplayResult:
    """Replay ``workload`` under ``loaded``; the simulated trace and a summary.

    Everything runs inside a pyfakefs fake filesystem and under a
    ``MockClock``: nothing touches the disk, nothing spawns, nothing waits.
    ``seed`` reshuffles trio's wake-up order (the output must not change).
    ``store`` is the run ledger to replay into, empty and already open (a
    real SQLite or PostgreSQL ledger, to check that the supervisor decides
    the same on it; the ledger's own files or sockets are untouched by the
    fake filesystem); by default an in-memory one. Its calls run inline.

    A replay that stops making progress (a spin, a stall, or no end after
    ``wall_limit`` seconds of wall time; None: no wall limit) raises
    :class:`~herdsman.sim.bounds.Stuck` naming what stopped moving, when,
    and the last event delivered (herdsman.sim.bounds).
    """
    if seed is not None:
        shuffle_trio(seed)
    began = time.perf_counter()
    # Autojump only matters once the input is over (a shutdown's grace
    # period): while driving, the driver moves the clock itself. The watched
    # clock autojumps too, and finds a replay that stops making progress.
    driver = Driver(workload)
    if store is None:
        # Made here, so its ledger may apply each call through its apply_one.
        memory = MemoryStore()
        ledger: Store = memory
        commits = Inline(memory.apply_one)
    else:
        ledger, commits = store, inline
    with Patcher(), young_collections_rarer():
        result = run_watched(
            lambda clock: _replay(workload, loaded, clock, ledger, driver, commits=commits),
            progress=lambda: driver.moves,
            where=lambda: _where(driver, workload),
            wall_limit=wall_limit,
            grace=loaded.config.supervisor.shutdown_grace.total_seconds(),
        )
    return attrs.evolve(result, wall_seconds=time.perf_counter() - began)


#: How many times as many allocations the cyclic collector lets pass
#: between its collections of the youngest generation while a replay runs.
YOUNG_COLLECTIONS_RARER = 100


@contextlib.contextmanager
def young_collections_rarer() -> Iterator[None]:
    """The cyclic garbage collector's youngest generation collected 100 times less often.

    A replay keeps nearly every container it makes (its ledger's records,
    the input's arrivals) and makes almost no cyclic garbage: about 1,000
    objects a 100,000-run replay, all found by the default thresholds. Yet
    those thresholds (700 net allocations a young collection, every tenth
    one an older, and a full one once the survivors grew by a quarter) made
    it traverse every live object again and again: the two full collections
    of a 100,000-run replay cost 4% of its time, each object visited a
    cache miss (docs/simulator.md). Rarer young collections still find
    that garbage; the older generations, each collected after every tenth
    collection of the one below, come 100 times rarer too. The thresholds
    are the process's own: they are put back afterwards.
    """
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0] * YOUNG_COLLECTIONS_RARER, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def _where(driver: Driver, workload: Workload) -> str:
    """The last event the driver delivered, in a few words with its time."""
    if driver.last is None:
        return "before the first event, the supervisor starting"
    t, kind, order = driver.last
    if kind == ARRIVAL and order < len(workload.arrivals):
        arrival = workload.arrivals[order]
        run = arrival.fields.get("run", {}).get("id") or arrival.fields.get("run_id")
        what = f"the {arrival.kind}" + (f" of {run}" if run else "")
    else:
        run = next((r for r, plan in workload.plans.items() if plan.index == order), None)
        what = f"the end of {run}'s attempt" if run else "a run's end"
    what += f" at t={t:.3f}"
    if not driver.driving:
        return f"the input over, the supervisor stopping (the last event: {what})"
    return f"the last event delivered: {what}"


async def _replay(
    workload: Workload,
    given: LoadedConfig,
    clock: trio.testing.MockClock,
    store: Store,
    driver: Driver,
    *,
    commits: Inline,
) -> ReplayResult:
    # Made again inside the fake filesystem: a Path object made before the
    # patch began is the real pathlib's (docs/simulator.md) and can make the same
    # folder look like two.
    plain_instruments()
    loaded = config_from_trace(_config_json(given), "configuration")
    config = loaded.config
    git = FakeGit()
    for repo in config.repos:
        repo.path.mkdir(parents=True, exist_ok=True)
        git.init_repository(repo.path, {"README.md": "a simulated repository\n"})
    out = io.StringIO()

    # The clock itself rather than trio.current_time(), which reaches it
    # through two more calls, and without its real-clock arithmetic
    # (mock_time): the supervisor, the trace and the fake runner read the
    # time about ten times a run. The same clock, so the same times.
    now = driver.now = mock_time(clock)
    started_at = workload.started_at

    def wall() -> float:
        return started_at + now()

    trace = TraceWriter(
        Path("/herdsman-sim/traces"),
        max_bytes=1 << 62,
        sink=out,
        config=_config_json(loaded),
        clock=now,
        wall=lambda: dt.datetime.fromtimestamp(wall(), dt.UTC),
    )
    supervisor = Supervisor(
        config,
        store,
        execute=driver.execute,
        wall=wall,
        trace=trace,
        # Nothing scrapes a replay's /metrics: its runs are left uncounted.
        metrics=Uncounted(),
        run_sync=commits,
        git=git,
        loaded=loaded,
        stop_orphans=False,
        resolve_program=lambda name: name,
    )
    trace.open()
    _seed_lost(store, workload, config, wall())
    async with trio.open_nursery() as nursery:
        feed = _Feed(driver, supervisor, workload.arrivals, nursery)
        await nursery.start(supervisor.run)
        feed.push_next()
        driver.driving = True
        await drive(driver, supervisor, clock)
        driver.driving = False
        driver.moves += 1  # what holds the supervisor's stop is bounded from here
        span = trio.current_time()
        left_queued = supervisor.status()["queued"]
        # The input is over; what stopping the simulated supervisor traces is not.
        text = out.getvalue()
        supervisor.request_shutdown()
        await supervisor.finished.wait()
        nursery.cancel_scope.cancel()
    trace.close()
    return recording_ends(
        ReplayResult(
            text,
            feed.runs,
            span,
            0.0,
            tuple(driver.executions.defaulted),
            left_queued,
            workload.rotated_at,
        ),
        workload,
    )


def _seed_lost(store: Store, workload: Workload, config: Config, now: float) -> None:
    """Put the runs the recording found lost at its start in the ledger as running.

    The supervisor's recovery then finds them, as the recorded one did,
    and records them lost in the same order. The trace names only their
    ids: any configured provider stands for theirs (recovery reads no more).
    """
    if not workload.lost:
        return
    provider = next(iter(config.providers))
    for run_id in workload.lost:
        new = NewRun(id=run_id, provider=provider, prompt="(not recorded)", workspace="default")
        store.submit(new, now)
    store.mark_running_many([(run_id, None) for run_id in workload.lost], now)


class Driven(Protocol):
    """What the driver reads of the supervisor it drives (the fuzzer's changes at a restart)."""

    @property
    def finished(self) -> trio.Event: ...

    @property
    def account_recheck_at(self) -> float | None: ...


# Why the driver may skip its wait after an event.
#
# The driver waits for every task to block after each event, so that what
# an event set off is over before the next begins. An event that made no
# task runnable (a submit that queued its run: a third of the benchmark's
# arrivals), delivered by a driver that never yielded meanwhile, leaves
# every other task blocked: the driver runs alone in its round (trio wakes
# a task from wait_all_tasks_blocked only when nothing else is runnable),
# and a task it made runnable would be in the run queue. The wait would be
# a whole round of trio's in which nothing else runs: nothing to wait for,
# but for a timer the event itself set due (the replay's tasks wait on no
# I/O: the ledger runs inline, nothing spawns, no socket). Such a timer
# is met at the next pass all the same: its deadline comes first, so the
# driver jumps the clock by nothing and waits then, before the next event,
# as the skipped wait would have had it act; and with no event left, the
# owed wait is made before the supervisor's state is read. With ``after``
# (the fuzzer's checks after every event) the driver always waits.
# trio's wake-up order, which a round draws from its random generator,
# decides nothing here, as everywhere in the replay.


# Why the driver rides along with the tasks an event woke.
#
# After an event that made tasks runnable, the driver used to wait for
# every task to block: trio wakes such a waiter only in a round in which
# nothing else is runnable, a round of its own (about 48,000 instructions
# in the replay). Instead the driver yields as a plain checkpoint, which
# puts it in the run queue behind the tasks it woke: the next round runs
# them and it, in an order trio draws. When it resumes, it looks: if no
# task is to run a step (none in the run queue, none woken and not yet run
# in the round it is in: trio's own mark on each task), every other task
# is blocked, just what the wait tells; otherwise it yields again, into the
# next round with whatever is still to run. It then goes on in the round
# in which the last task it set off ran, or, if trio ran it before that
# one, in a round after (alone, as the wait's was). What each task does
# and the order in which the events are delivered do not depend on which
# round the driver learns it in: it goes on only once every other task is
# blocked. A timer due meanwhile is met as after a skipped wait: at the
# next pass its deadline comes first and the driver waits then (the note
# above); the replay's tasks wait on no I/O. With ``after`` (the fuzzer's
# checks after every event) the driver always waits.


async def _ride_along(runnable: deque[trio.lowlevel.Task]) -> None:
    """Yield until no other task is to run a step: until every other task is blocked.

    Only for a driver that runs alone in its round or after every other
    task in it (as after a wait for blocked tasks, or this), and that has
    not yielded since: then an empty run queue says it at once.
    """
    if not runnable:
        return
    living = tasks()
    while True:
        await trio.lowlevel.cancel_shielded_checkpoint()
        if not runnable and not any_woken(living):
            return


async def drive(
    driver: Driver,
    supervisor: Driven,
    clock: trio.testing.MockClock,
    after: Callable[[], bool] | None = None,
) -> None:
    """Deliver every event in order, one at a time, until nothing more can happen.

    ``after`` is called once whatever each event or timer set off has
    settled; it returns True to stop driving (the fuzzer found a violation).

    Without ``after`` (the replay), the driver does not wait for blocked
    tasks after an event: it rides along with what the event set off, if
    anything (the notes above).
    """
    now_is = mock_time(clock)
    settle = settler()
    queued = runnable()
    me = trio.lowlevel.current_task()
    owed = False  # a wait for blocked tasks skipped (see below)
    # Each pass starts with every task blocked and no timer due: only the
    # driver can make something happen now.
    await settle()
    while True:
        t = driver.next_time()
        if t is None:
            if owed:
                # Before the supervisor's state is read, as after any event.
                owed = False
                await settle()
                continue
            if supervisor.finished.is_set():
                return  # stopped (a replayed shutdown): nothing more can happen
            # Queued runs may wait for a resting account: the dispatcher's
            # timer for its return is the next thing to happen (reached
            # below, as a supervisor timer). Other timers (retention sweeps)
            # go on forever and change nothing the replay reports: a sweep
            # of the replay's takes no time, so no submit waits for it
            # (docs/simulator.md, "Worktree sweeps in a replay").
            t = supervisor.account_recheck_at
            if t is None:
                return
        now = now_is()
        to_timer = next_deadline() - now
        if to_timer <= t - now:
            # The supervisor's own timer comes first (or at the same
            # instant: it acts before the event). Jumped by the same
            # arithmetic as MockClock's autojump, so the times are the same.
            clock.jump(max(0.0, to_timer))
            owed = False
            await settle()
            if after is not None and after():
                return
            continue
        if t > now:
            clock.jump(t - now)
        item = driver.pop()
        if item is None:
            # Nothing was due (a time to look again): look, all the same.
            if after is not None and after():
                return
            continue
        _, action = item
        passed = checkpoints(me)
        pending = action()
        if pending is not None:
            await pending
        if after is None and checkpoints(me) == passed:
            # No wait for blocked tasks: if the event set nothing off, every
            # other task is blocked already, and the wait would be a round of
            # trio's in which nothing else runs; if it did, the driver rides
            # along with what it set off (the notes above drive).
            await _ride_along(queued)
            owed = True
            continue
        owed = False
        await settle()
        if after is not None and after():
            return


class _Feed:
    """The trace's arrivals, handed to the supervisor one at a time through the driver.

    One arrival is in the driver's heap at a time: each, delivered, puts
    the next one in. One coroutine an arrival, the delivery itself.
    """

    def __init__(
        self,
        driver: Driver,
        supervisor: Supervisor,
        arrivals: Sequence[Arrival],
        nursery: trio.Nursery,
    ) -> None:
        self._driver = driver
        self._supervisor = supervisor
        self._arrivals = arrivals
        self._nursery = nursery
        self._next = 0  # the arrival in the heap, or past the last one
        #: Runs the arrivals submitted (created in the ledger, queued or skipped).
        self.runs = 0
        # Runs whose submit waits, as recorded, for a removal of their
        # conversation's worktrees: the removal the replay holds under way.
        self._held: dict[str, contextlib.ExitStack] = {}

    def push_next(self) -> None:
        """Put the next arrival in the driver's heap, if there is one."""
        order = self._next
        if order < len(self._arrivals):
            self._driver.push(self._arrivals[order].t, ARRIVAL, order, self._deliver)

    async def _deliver(self) -> None:
        arrival = self._arrivals[self._next]
        self._next += 1
        supervisor = self._supervisor
        if supervisor.finished.is_set():
            pass  # it has stopped (a replayed shutdown): nothing reaches it any more
        elif arrival.kind == "submit" and arrival.fields["run"]["id"] in self._held:
            # Recorded once the removal was over: it is over now, and the
            # submit made at the wait's beginning goes on and records it.
            self._held.pop(arrival.fields["run"]["id"]).close()
        elif arrival.kind in ("submit", "skip"):
            await self._submit(arrival.fields, arrival.kind)
        elif arrival.kind == "removal_wait":
            self._hold(arrival.fields)
        else:
            await deliver_arrival(supervisor, arrival)
        self.push_next()

    async def _submit(self, fields: Mapping[str, Any], kind: str) -> None:
        supervisor = self._supervisor
        new = new_run(fields["run"])
        if "account" in fields:  # running on it when the trace file was rotated
            supervisor.pin_account(new.id, fields["account"])
        try:
            # submit(new, on_busy) without its two wrapping coroutines.
            (result,) = await supervisor.submit_each([(new, "skip" if kind == "skip" else "queue")])
            _, created = result.unwrap()
        except NotAdmitting:  # after a replayed shutdown, as production refused it
            pass
        else:
            self.runs += created  # a repeated id is the run it already was

    def _hold(self, fields: Mapping[str, Any]) -> None:
        """A submit that waited for a sweep's removal: submitted now, held until recorded.

        The replay's own sweeps remove worktrees at once (its git takes no
        time), so none of its submits ever waits for one; the recording's
        did, and meanwhile its conversation (and agent) counted as busy to a
        submit that skips. The replay marks a removal of the conversation's
        worktrees under way until the run's recorded submit, and submits
        it now: the supervisor claims its keys and waits, as the recorded
        one did. A second wait on a conversation already held is not held
        again (one release would wake both, in trio's order): that run is
        submitted at its recorded submit, as without a wait
        (docs/simulator.md, "Worktree sweeps in a replay").
        """
        run = fields["run"]
        worktrees = self._supervisor.worktrees
        conversation, workspace = run.get("conversation"), run.get("workspace", "default")
        if (
            worktrees is None  # a what-if without repositories: nothing to wait for
            or conversation is None
            or worktrees.removal_under_way(workspace, conversation)
        ):
            return
        removal = contextlib.ExitStack()
        removal.enter_context(worktrees.removing(workspace, conversation))
        self._held[run["id"]] = removal
        self._nursery.start_soon(self._submit, {"run": run}, "submit")


def new_run(run: Mapping[str, Any]) -> NewRun:
    """A trace's run object as the ledger's new run (its prompt, if not traced, says so)."""
    return NewRun(
        id=run["id"],
        provider=run["provider"],
        prompt=run.get("prompt", "(not recorded)"),
        conversation=run.get("conversation"),
        agent=run.get("agent"),
        workspace=run.get("workspace", "default"),
        cwd=run.get("cwd"),
    )


async def deliver_arrival(supervisor: Supervisor, arrival: Arrival) -> None:
    """Hand an arrival other than a submit or skip to the supervisor."""
    fields = arrival.fields
    if arrival.kind == "cancel":
        # Already ended (or never submitted) in this replay: nothing to cancel.
        with contextlib.suppress(RunNotFound, RunConflict):
            await supervisor.cancel(fields["run_id"])
        return
    if arrival.kind == "shutdown":
        # As the signals did: the first drains (nothing new starts), a
        # forced one cancels what still runs.
        supervisor.request_shutdown()
        return
    if arrival.kind == "rest":  # resting when the trace file was rotated
        await supervisor.rest_account(
            fields["provider"], fields["account"], fields["until"], CARRIED_REST
        )
        return
    if arrival.kind == "rest_ended":
        with contextlib.suppress(UnknownAccount):  # a what-if without that account
            await supervisor.end_rest(fields["provider"], fields["account"])
        return
    if arrival.kind == "reload":
        loaded = config_from_trace(fields["config"], f"reload at t={arrival.t}")
        await supervisor.reload_to(loaded, "trace")
        return


def _config_json(loaded: LoadedConfig) -> dict[str, Any]:
    from herdsman.config.report import config_as_json  # noqa: PLC0415

    return config_as_json(loaded.config)
