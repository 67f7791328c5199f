"""Run one fuzz scenario through the whole supervisor, faults and all, checking as it goes.

Why this module is long: ``_Fuzz`` is one scenario's run, and its faults
(crash, restart, disk full, bad reload) act on the same supervisor lives,
clock and checker as its event loop; the stand-ins it drives live in
:mod:`~herdsman.sim.fuzz.stand_ins`, its client and spin watch in
:mod:`~herdsman.sim.fuzz.client`.

This is the full-fidelity replay (``herdsman.sim.replay``): the real
:class:`~herdsman.runtime.supervisor.Supervisor` on a ``MockClock``, inside a
pyfakefs filesystem, with the in-memory ledger, the fake git and the
replay's fake runner and event driver — plus faults. The driver delivers
one event at a time and lets everything it sets off settle; then the
checker compares its model with the ledger and the scheduler, and looks at
the worktrees the agents left files in. The run stops at the first
violation.

A crash keeps what a real one keeps: the ledger as last committed (a copy
taken at the crash; whatever the dying supervisor records afterwards is
lost with it) and the disk (the fake filesystem, the fake git's state). The
new supervisor reads the configuration file again — the last one that was
valid, as an operator would have fixed it to start it — and recovers.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import attrs
import trio
import trio.testing
from pyfakefs.fake_filesystem import FakeFilesystem
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.config import ConfigError, load_config_text
from herdsman.config.report import config_as_json
from herdsman.runtime.git import GitError
from herdsman.runtime.git.fake import Operation
from herdsman.runtime.ledger import Inline
from herdsman.runtime.reload import ConfigSource
from herdsman.runtime.store import MemoryStore, NewRun
from herdsman.runtime.supervisor import (
    NotAdmitting,
    RunConflict,
    RunNotFound,
    Supervisor,
    UnknownAccount,
)
from herdsman.runtime.worktrees.manager import METADATA
from herdsman.runtime.worktrees.slug import conversation_slug
from herdsman.sim.bounds import STEPS_AT_ONE_INSTANT, STOP_GRACE, WALL_LIMIT, InThread
from herdsman.sim.fuzz.agent_faults import attempt_of
from herdsman.sim.fuzz.client import _Client, _describe, _SpinWatch
from herdsman.sim.fuzz.invariants import Checker, Violation
from herdsman.sim.fuzz.links import LINK_FAULTS, LinkFaults
from herdsman.sim.fuzz.scenario import Scenario, ScenarioError
from herdsman.sim.fuzz.stand_ins import _CheckedGit, _Life, _Runner, _Sink
from herdsman.sim.replay import ARRIVAL, drive
from herdsman.sim.trio_internals import shuffle_trio
from herdsman.sim.workload import RunPlan, Workload
from herdsman.trace import TraceHeader, TraceWriter, format_time

__all__ = [
    "CONFIG_PATH",
    "STARTED_AT",
    "STEPS_AT_ONE_INSTANT",
    "WALL_LIMIT",
    "Verdict",
    "run_scenario",
]

#: The simulated clock's start (unix seconds), a whole second.
STARTED_AT = 1_795_000_000.0
CONFIG_PATH = Path("/herdsman-sim/supervisor.toml")
#: How long a usage limit without a reset time, or a quota window, may hold runs.
_LONGEST_REST = 3600.0
#: How long after a run finds its account not logged in the operator logs it
#: in again (by a reload, or by ending its rest: each in turn).
LOGIN_AFTER = 300.0
_AGENT_FILE = "agent-notes-{run}.txt"
#: What the clients send (a request may wait for simulated time to pass);
#: the other events are the world's doing, delivered by the driver itself.
CLIENT_KINDS = frozenset({"submit", "cancel", "reload"})
#: How long (wall-clock seconds) every task must have waited before the
#: time keeper looks: longer than the driver's own wait (none), which comes first.
_KEEPER_CUSHION = 0.001


@attrs.frozen
class Verdict:
    """How a scenario went: the violations found (the run stops at the first)."""

    scenario: Scenario
    violations: tuple[Violation, ...]
    #: The simulated supervisors' traces, one per life (a crash starts another).
    traces: tuple[str, ...]
    span: float
    wall_seconds: float
    #: The scenario's faults that took effect: each delivered, a git failure
    #: only once a git call met it (one drawn for a scenario without
    #: repositories, or a call that never came, changed nothing).
    faults: int = 0

    @property
    def failed(self) -> bool:
        """Whether an invariant did not hold."""
        return bool(self.violations)


def run_scenario(scenario: Scenario, *, wall_limit: float | None = WALL_LIMIT) -> Verdict:
    """Run ``scenario`` and check it; the same verdict for the same scenario in any process.

    ``wall_limit`` bounds it in wall-clock seconds (None: no bound), the
    last resort behind the bounds in simulated time: a run with no verdict
    by then is a ``wall time`` violation, and its thread is left behind.
    """
    # The seed also picks trio's wake-up order: one more thing a seed varies,
    # and a reproduction must not depend on (docs/simulator.md, "Determinism").
    shuffle_trio(scenario.seed)
    began = time.perf_counter()
    clock = trio.testing.MockClock()  # never jumps by itself: the driver moves it
    with Patcher() as patcher:
        assert patcher.fs is not None
        fuzz = _Fuzz(scenario, patcher.fs, clock)
        raised: list[BaseException] = []

        async def main() -> None:
            fuzz.bound.entered()
            await fuzz.run(clock)

        def run() -> None:
            try:
                trio.run(main, clock=clock, instruments=[_SpinWatch(fuzz, clock)])
            except BaseException as error:  # handed to the caller's thread
                raised.append(error)
            finally:
                fuzz.give_verdict()

        # In a thread of its own: a supervisor that will not stop (a task
        # stuck in a shielded scope) keeps trio.run from returning; its
        # verdict is given all the same and the thread, asleep for ever, is
        # abandoned.
        fuzz.bound.start(run, f"fuzz-{scenario.seed}")
        if not fuzz.bound.wait(wall_limit):
            fuzz.out_of_time(wall_limit)
        if raised:
            error = raised[0]
            if isinstance(error, ScenarioError) or not isinstance(error, Exception):
                raise error
            # The supervisor itself fell over: a finding too.
            fuzz.violations.append(Violation("raised", clock.current_time(), _what(error)))
    return Verdict(
        scenario,
        tuple(fuzz.violations),
        fuzz.traces,
        fuzz.span,
        time.perf_counter() - began,
        fuzz.faults + fuzz.git_injected - fuzz.git_pending,
    )


def _what(error: BaseException) -> str:
    """The first exception inside ``error``'s groups, and where it was raised."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def deadline_after_faults(scenario: Scenario) -> float:
    """When the queue must be empty: a generous bound on all the work after the last event.

    Every attempt in a row, each usage limit resting its account as long as
    one can, each run waiting out a quota window, each disk-full spell.
    """
    last = max((float(event["t"]) for event in scenario.events), default=0.0)
    work = rests = 0.0
    runs = 0
    for event in scenario.events:
        if event["kind"] == "submit":
            runs += 1
            # A retry's backoff (at most 2 minutes as drawn), an account
            # out of budget for a window, one needing a login until the
            # operator logs it in.
            rests += 120.0 * len(event["attempts"]) + 900.0 + LOGIN_AFTER
            for attempt in event["attempts"]:
                work += float(attempt["duration"])
                if attempt["outcome"] == "usage_limited":
                    rests += max(_LONGEST_REST, float(attempt.get("resets_in", 0.0)))
        elif event["kind"] == "disk_full":
            work += float(event["seconds"])
    return last + work + rests + 300.0 * runs + 120.0


class _Fuzz:
    """One scenario's run: the parts, the faults, and the checks after each event."""

    def __init__(
        self, scenario: Scenario, fs: FakeFilesystem, clock: trio.testing.MockClock
    ) -> None:
        self.scenario = scenario
        self.fs = fs
        self._clock = clock
        self.sinks: list[_Sink] = []
        # The first submit of each run says how it goes; one sent again is the same run.
        self.submits: dict[str, Mapping[str, Any]] = {}
        for event in scenario.events:
            if event["kind"] == "submit":
                self.submits.setdefault(event["run"]["id"], event)
        self.checker = Checker(
            trio.current_time, {run_id: event["run"] for run_id, event in self.submits.items()}
        )
        #: The run's thread, bounded in wall time; its verdict given once.
        self.bound = InThread()
        self.violations: list[Violation] = []
        self.traces: tuple[str, ...] = ()
        self.git_pending = 0
        #: Whether a supervisor failed to stop: the run is then abandoned.
        self._stuck = False
        # What the driver waits for inside a step (a stop, a restart), and
        # until when (simulated) it may; None while it only delivers events.
        self._holding: tuple[str, float] | None = None
        self._delivering = "nothing yet"
        self._winding_down = False
        self._scenario_scope = trio.CancelScope()
        self.client = _Client(self)
        #: Set while a supervisor is up to take requests (not while one restarts).
        self.up = trio.Event()
        #: Faults delivered, git failures apart; git failures injected.
        self.faults = self.git_injected = 0
        self.git = _CheckedGit(
            self._removing, scenario.git_latency, self.checker.removals, self._send_on_removal
        )
        # Follow-ups sent once a removal of their conversation's worktrees
        # begins (``on_removal``): (its folder, what, the request), in order.
        self._on_removal: list[tuple[str, str, Callable[[], Awaitable[None]]]] = []
        self.links = LinkFaults()
        # Files agents left in worktrees: path -> the run that wrote it.
        self._left: dict[Path, str] = {}
        self._disk_full = 0
        self._valid_config = scenario.config
        self._deadline = STARTED_AT + deadline_after_faults(scenario)
        self.span = 0.0
        self._life: _Life | None = None
        self._nursery: trio.Nursery | None = None
        # Lives asked to shut down (each is restarted once it has stopped).
        self._stopping: list[_Life] = []
        self._logins = 0  # the operator's logins so far

    def wall(self) -> float:
        """The simulated unix time."""
        return STARTED_AT + trio.current_time()

    # -- the run -----------------------------------------------------------

    async def run(self, clock: trio.testing.MockClock) -> None:
        """The whole scenario, with the time keeper beside it."""
        async with trio.open_nursery() as keeper:
            keeper.start_soon(self._keep_time, clock)
            with self._scenario_scope:
                await self._scenario(clock)
            keeper.cancel_scope.cancel()

    async def _scenario(self, clock: trio.testing.MockClock) -> None:
        CONFIG_PATH.parent.mkdir(parents=True, exist_ok=True)
        CONFIG_PATH.write_text(self.scenario.config, encoding="utf-8")
        try:
            first = ConfigSource(CONFIG_PATH, environ={}, watch=False).load()
        except ConfigError as error:
            problems = "; ".join(str(p) for p in error.problems)
            raise ScenarioError(f"fuzz.config: {problems}") from None
        for repo in first.config.repos:
            repo.path.mkdir(parents=True, exist_ok=True)
            self.git.init_repository(repo.path, {"README.md": "a simulated repository\n"})
        await self.links.prepare(first.config.supervisor.state_dir, first.config.repos)
        runner = _Runner(self._workload(), self)
        self._runner = runner
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            with self._holding_for("the supervisor starts"):
                await self._start(MemoryStore())
            self.up.set()
            nursery.start_soon(self.client.serve)
            for order, event in enumerate(self.scenario.events):
                runner.push(float(event["t"]), ARRIVAL, order, self._action(event))
            runner.driving = True
            await drive(runner, _Current(self), clock, self._after)
            runner.driving = False
            if not self.checker.violations:
                self.client.answered()
            if not self.checker.violations:
                self.checker.drained("when nothing was left that could start them")
            self.span = trio.current_time()
            life = self._life
            assert life is not None
            life.sink.live = False  # what stopping it traces is not checked
            if not self._stuck:
                life.scope.cancel()
                await self._stopped(life, "told to stop")
            if self._stuck:
                # Its stuck task keeps this nursery open for ever: give the
                # verdict now and leave this thread asleep.
                self.abandon()
            nursery.cancel_scope.cancel()

    @contextlib.contextmanager
    def _holding_for(self, what: str) -> Iterator[None]:
        """The driver waits for ``what`` (at most STOP_GRACE, simulated): the keeper moves time."""
        self._holding = (what, trio.current_time() + STOP_GRACE + 1.0)
        try:
            yield
        finally:
            self._holding = None

    async def _keep_time(self, clock: trio.testing.MockClock) -> None:
        """Move the clock while the driver waits inside a step; a stall is a liveness violation.

        Once every task has waited (the driver's own wait for that comes
        first: it is the driver's turn then), the driver is held inside a
        step — a supervisor stopping or recovering — and time must pass for
        it: the clock jumps to the next timer, as ``MockClock``'s autojump
        would. No timer left, or none before the hold's bound, is a run
        that will never go on; so is a driver held inside an event.
        """
        threads = trio.to_thread.current_default_thread_limiter()
        while True:
            await trio.testing.wait_all_tasks_blocked(_KEEPER_CUSHION)
            if threads.statistics().borrowed_tokens:
                continue  # a thread is at work: what it brings back comes first
            now = trio.current_time()
            to_timer = trio.lowlevel.current_statistics().seconds_to_next_deadline
            if self._holding is None:
                self.stall(
                    f"every task waits, the driver too, inside {self._delivering},"
                    " where nothing should hold it"
                )
            elif now + to_timer > self._holding[1]:
                what, until = self._holding
                when = (
                    "and no timer is left"
                    if to_timer == float("inf")
                    else (f"and nothing is due before t={until:.3f}")
                )
                self.stall(f"every task waits while {what}, {when}")
            else:
                clock.jump(to_timer)

    def stall(self, message: str) -> None:
        """Nothing can move the run on: a liveness violation, and the run wound down.

        A run that cannot even wind down (a task stuck where no
        cancellation reaches it) is abandoned, asleep.
        """
        if self._winding_down:
            self.abandon()
        self._winding_down = True
        self.checker.fail("liveness", message)
        self._holding = ("the run winds down", trio.current_time() + STOP_GRACE)
        self._scenario_scope.cancel()

    def give_verdict(self) -> None:
        """Take the verdict as it stands (once: the first call wins) and tell the caller."""
        self.bound.give(self._take_verdict)

    def _take_verdict(self, *late: Violation) -> None:
        for sink in self.sinks:
            sink.live = False  # what the run traces from now on is not part of it
        self.violations = [*self.checker.violations, *late]
        self.traces = tuple(sink.text for sink in self.sinks)
        self.git_pending = self.git.pending_failures

    def abandon(self) -> NoReturn:
        """Give the verdict and stop this thread where it is, for ever (it does nothing more)."""
        self.bound.abandon(self._take_verdict)

    def out_of_time(self, seconds: float | None) -> None:
        """No verdict within ``seconds`` of wall time: a violation; the run stops where it is.

        Its thread stops before its next task step (the spin watch sees to
        it, told by :meth:`InThread.wait`).
        """
        t = self._clock.current_time()
        late = Violation(
            "wall time",
            t,
            f"no verdict after {seconds:g}s of wall time; the simulated clock stood"
            f" at t={t:.3f}, the last event delivered: {self._delivering}",
        )
        self.bound.give(lambda: self._take_verdict(late))  # unless it came in meanwhile

    async def _stopped(self, life: _Life, how: str) -> bool:
        """Whether ``life``'s supervisor, ``how``, stops within the grace; a violation if not."""
        with self._holding_for(f"the supervisor, {how}, stops"), trio.move_on_after(STOP_GRACE):
            await life.supervisor.finished.wait()
        if life.supervisor.finished.is_set():
            return True
        self._stuck = True
        self.checker.fail(
            "supervisor did not stop", f"{how}, it had not stopped {STOP_GRACE:.0f}s later"
        )
        return False

    def _workload(self) -> Workload:
        plans = {
            run_id: RunPlan(
                index,
                # Spawned, so counted against budgets: the exit code of its
                # outcome (or failure) unless the scenario names one.
                [attempt_of(a) for a in event["attempts"]],
                synthetic=True,
            )
            for index, (run_id, event) in enumerate(self.submits.items())
        }
        started = format_time(dt.datetime.fromtimestamp(STARTED_AT, dt.UTC))
        header = TraceHeader(1, started, {}, None)
        return Workload(header, STARTED_AT, (), plans)

    async def _start(self, store: MemoryStore) -> None:
        """Start a supervisor on ``store``; returns once it has recovered."""
        assert self._nursery is not None
        source = ConfigSource(CONFIG_PATH, environ={}, watch=False)
        loaded = source.load()
        sink = _Sink(self.checker)
        self.sinks.append(sink)
        trace = TraceWriter(
            Path("/herdsman-sim/traces"),
            max_bytes=1 << 62,
            sink=sink,
            config=config_as_json(loaded.config),
            clock=trio.current_time,
            wall=lambda: dt.datetime.fromtimestamp(self.wall(), dt.UTC),
        )
        supervisor = Supervisor(
            loaded.config,
            store,
            execute=self._runner.execute,
            wall=self.wall,
            trace=trace,
            run_sync=Inline(store.apply_one),
            git=self.git,
            source=source,
            loaded=loaded,
            stop_orphans=False,
            resolve_program=lambda name: name,
        )
        trace.open()
        scope = trio.CancelScope()

        async def live(
            *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
        ) -> None:
            with scope:
                await supervisor.run(task_status=task_status)

        self._life = _Life(supervisor, store, sink, scope)
        await self._nursery.start(live)

    # -- events ------------------------------------------------------------

    def _action(self, event: Mapping[str, Any]) -> Callable[[], Any]:
        kind = event["kind"]
        what = _describe(event)

        async def act() -> None:
            assert self._life is not None
            supervisor = self._life.supervisor  # the one alive when the request goes
            if kind == "submit":
                await self._submit(supervisor, event)
            elif kind == "cancel":
                for run_id in event["run_ids"]:  # a storm: one after another, at once
                    with contextlib.suppress(RunNotFound, RunConflict):
                        await supervisor.cancel(run_id)
            elif kind == "reload":
                await self._reload(supervisor, event["toml"])
            elif kind == "git_failure":
                operation: Operation = event["operation"]
                error = GitError(["git", operation], "fatal: simulated failure", 128)
                self.git.inject_failure(operation, error)
            elif kind == "disk_full":
                await self._fill_disk(float(event["seconds"]))
            elif kind == "crash":
                await self._crash()
            elif kind == "shutdown":
                self._shut_down(event.get("force_after"))
            elif kind in LINK_FAULTS:
                await self.links.apply(event)

        def deliver() -> Awaitable[None] | None:
            self._delivering = what
            if kind == "git_failure":
                self.git_injected += 1  # a fault once a call meets it
            elif kind != "submit" or event.get("again"):
                self.faults += 1
            if event.get("on_removal") and not event.get("again"):
                run = event["run"]
                folder = conversation_slug(run.get("workspace", "default"), run["conversation"])
                self._on_removal.append((folder, what, act))
                return None
            if kind in CLIENT_KINDS:
                # A client's request may wait for time to pass (a submit
                # waits out the removal of its conversation's worktree, a
                # slow git call): the driver, which alone moves the clock,
                # hands it to the client and goes on.
                return self.client.hand_over(what, act)
            return act()

        return deliver

    def _send_on_removal(self, path: Path) -> None:
        """A removal of ``path`` begins: send the follow-ups to its conversation waiting for one."""
        folder = path.parent.name
        for held in [held for held in self._on_removal if held[0] == folder]:
            self._on_removal.remove(held)
            self.client.send(held[1], held[2])

    async def _submit(self, supervisor: Supervisor, event: Mapping[str, Any]) -> None:
        run = event["run"]
        new = NewRun(
            id=run["id"],
            provider=run["provider"],
            prompt="(fuzz)",
            conversation=run.get("conversation"),
            agent=run.get("agent"),
            workspace=run.get("workspace", "default"),
        )
        with contextlib.suppress(NotAdmitting):
            await supervisor.submit(new, event.get("on_busy", "queue"))

    async def _reload(self, supervisor: Supervisor, text: str) -> None:
        try:
            load_config_text(text, CONFIG_PATH, environ={})
        except ConfigError:
            valid = False
        else:
            valid = True
        try:
            CONFIG_PATH.write_text(text, encoding="utf-8")
        except OSError:
            return  # the disk is full: the operator could not save the file
        before, generation = supervisor.config, supervisor.generation
        # Any applied reload logs every account in, even of a file that did
        # not change; a rejected one changes nothing: the checker is told first.
        if valid:
            self.checker.accounts.logged_in()
        result = await supervisor.reload("fuzz")
        if valid:
            self._valid_config = text
            if not result.ok:
                self.checker.fail(
                    "reload", f"a valid file was rejected: {'; '.join(result.errors)}"
                )
        elif result.ok or supervisor.config is not before or supervisor.generation != generation:
            self.checker.fail("reload", "an invalid file was not rejected, or changed something")

    async def _fill_disk(self, seconds: float) -> None:
        _, used, _ = self.fs.get_disk_usage()
        self.fs.set_disk_usage(used)
        self._disk_full += 1

        async def free() -> None:
            self._disk_full -= 1
            if not self._disk_full:
                self.fs.set_disk_usage(1 << 40)

        # After the events of that instant, like a freed disk noticed late.
        self._runner.push(trio.current_time() + seconds, ARRIVAL, len(self.scenario.events), free)

    @contextlib.contextmanager
    def _room(self) -> Iterator[None]:
        """Room on the disk for a moment, full or not."""
        self.fs.set_disk_usage(1 << 40)
        try:
            yield
        finally:
            if self._disk_full:
                self.fs.set_disk_usage(self.fs.get_disk_usage()[1])

    def _shut_down(self, force_after: float | None) -> None:
        """A first signal now; a second ``force_after`` seconds later; a restart once stopped."""
        life = self._life
        assert life is not None
        assert self._nursery is not None
        life.supervisor.request_shutdown()
        if force_after is not None:

            async def force() -> None:
                if self._life is life:  # not a later life's (a crash came between)
                    life.supervisor.request_shutdown()

            at = trio.current_time() + float(force_after)
            self._runner.push(at, ARRIVAL, len(self.scenario.events), force)
        if all(life is not other for other in self._stopping):
            self._stopping.append(life)
            self._nursery.start_soon(self._restart_when_stopped, life)

    async def _restart_when_stopped(self, life: _Life) -> None:
        """Once ``life``'s supervisor has shut down, start one again on its ledger.

        The restart is an event of the driver's, delivered at once, as a
        crash's is a step of one: nothing is checked while it recovers.
        """
        await life.supervisor.finished.wait()
        if self._life is not life or not self._runner.driving:
            return  # killed meanwhile (a crash restarted it), or the scenario is over

        async def restart() -> None:
            if self._life is not life:
                return  # a crash at the same instant restarted it first
            self._delivering = "the restart after a shutdown"
            # Everything it recorded is kept (a clean stop): what a restart
            # restates is checked as after a crash. A request under way
            # gets no answer from a supervisor that has stopped; the next
            # ones wait for the new one.
            self.checker.crashed()
            self.up = trio.Event()
            self.client.drop()
            self._fix_config()
            with self._holding_for("the supervisor recovers after a shutdown"):
                await self._start(life.store)
            self.checker.restarted()
            self.up.set()

        self._runner.push(trio.current_time(), ARRIVAL, len(self.scenario.events), restart)

    def _log_in_later(self, provider: str, account: str | None) -> None:
        """An account needs a login: the operator logs it in, LOGIN_AFTER seconds later.

        Each in turn by a reload of the file as it is, or by ending the
        account's rest (``herdsman accounts end-rest``), as docs/accounts.md
        says an operator does. Not a fault of the scenario's: its answer.
        """
        self._logins += 1
        by_reload = self._logins % 2 == 0
        what = f"the operator logs {provider}/{account} in"

        async def log_in() -> None:
            assert self._life is not None
            supervisor = self._life.supervisor
            if by_reload:
                await self._reload(supervisor, self._valid_config)
                return
            with contextlib.suppress(UnknownAccount, NotAdmitting):
                await supervisor.end_rest(provider, account)

        def deliver() -> Awaitable[None]:
            self._delivering = what
            return self.client.hand_over(what, log_in)

        at = trio.current_time() + LOGIN_AFTER
        self._runner.push(at, ARRIVAL, len(self.scenario.events) + self._logins, deliver)

    def _fix_config(self) -> None:
        """Put the last valid file back if the one on disk is not, as an operator would."""
        try:
            ConfigSource(CONFIG_PATH, environ={}, watch=False).load()
        except ConfigError:
            with self._room():  # the operator's fix is no fault of the scenario's
                CONFIG_PATH.write_text(self._valid_config, encoding="utf-8")

    async def _crash(self) -> None:
        life = self._life
        assert life is not None
        self.checker.crashed()
        # What was committed survives; what the dying supervisor records does not.
        store = copy.deepcopy(life.store)
        life.sink.live = False
        # The client's request under way dies with it, unanswered; the next
        # ones wait for the new supervisor.
        self.up = trio.Event()
        self.client.drop()
        life.scope.cancel()
        # Its dying tasks may wait on timers: the time keeper moves the clock
        # (nothing else happens meanwhile).
        if not await self._stopped(life, "killed"):
            return  # the run is abandoned: nothing can restart it
        self._fix_config()
        with self._holding_for("the supervisor recovers after a crash"):
            await self._start(store)
        self.checker.restarted()
        self.up.set()

    # -- checks ------------------------------------------------------------

    def leave_files(self, repos: Path, run_id: str) -> None:
        """An agent's edits: an untracked file in each of its worktrees."""
        for repo in sorted(self.git_repos(repos)):
            path = repos / repo / _AGENT_FILE.format(run=run_id)
            try:
                path.write_text("work in progress\n", encoding="utf-8")
            except OSError:
                continue  # a full disk: the agent could not save it
            self._left[path] = run_id

    @staticmethod
    def git_repos(repos: Path) -> list[str]:
        """The worktrees in a conversation's folder (a checkout that failed is absent)."""
        if not repos.is_dir():
            return []
        # Never through a link: the agent was told that checkout is read-only.
        return [p.name for p in repos.iterdir() if not p.is_symlink() and (p / ".git").exists()]

    def _removing(self, path: Path) -> None:
        """A worktree is about to go: its conversation must have nothing queued or running."""
        metadata = path.parent / METADATA
        try:
            owner = json.loads(metadata.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        workspace, conversation = owner.get("workspace"), owner.get("conversation")
        if (
            isinstance(workspace, str)
            and isinstance(conversation, str)
            and self.checker.busy(workspace, conversation)
        ):
            self.checker.fail(
                "busy worktree removed",
                f"{path} removed while {workspace}/{conversation} has a queued or running run",
            )

    def _after(self) -> bool:
        """After each event: the ledger, the scheduler and the worktrees; True to stop."""
        checker = self.checker
        life = self._life
        assert life is not None
        if not checker.violations:
            self.client.answered(by_now=False)
        if not checker.violations:
            records = [life.store.get(run_id) for run_id in checker.run_ids]
            status = life.supervisor.status()
            checker.settled(records, status)
        self.links.check(checker)
        while checker.logins_needed:
            self._log_in_later(*checker.logins_needed.pop(0))
        for path, run_id in list(self._left.items()):
            if not path.exists():
                del self._left[path]
                checker.fail(
                    "dirty worktree removed", f"{path.parent} held {path.name}, left by {run_id}"
                )
        if self.wall() > self._deadline:
            # Past the bound nothing more may happen: stop, finished or not.
            if not checker.violations:
                self.client.answered()
            if not checker.violations:
                checker.drained("at the bound after the last fault")
            return True
        return bool(checker.violations)


class _Current:
    """The supervisor now alive, as the driver reads it (a crash replaces it)."""

    def __init__(self, fuzz: _Fuzz) -> None:
        self._fuzz = fuzz

    @property
    def finished(self) -> trio.Event:
        assert self._fuzz._life is not None
        return self._fuzz._life.supervisor.finished

    @property
    def account_recheck_at(self) -> float | None:
        """When to look again though no event is due: the supervisor's recheck, or,
        while runs are queued or running or a client's request is under way,
        its next timer (a slow git call ends)."""
        fuzz = self._fuzz
        assert fuzz._life is not None
        recheck = fuzz._life.supervisor.account_recheck_at
        if recheck is not None or not (fuzz.checker.unsettled() or fuzz.client.busy):
            return recheck
        # No later than just past the bound, where the checks stop the drive.
        bound = fuzz._deadline - STARTED_AT + 1.0
        to_timer = trio.lowlevel.current_statistics().seconds_to_next_deadline
        return min(trio.current_time() + to_timer, max(bound, trio.current_time()))
