"""Run one fuzz scenario through the whole supervisor, faults and all, checking as it goes.

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
import io
import itertools
import json
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio
import trio.testing
from pyfakefs.fake_filesystem import FakeFilesystem
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.config import ConfigError, load_config_text
from herdsman.config.report import config_as_json
from herdsman.runtime.git import GitError
from herdsman.runtime.git.fake import FakeGit, Operation
from herdsman.runtime.ledger import inline
from herdsman.runtime.reload import ConfigSource
from herdsman.runtime.runner import ProcessOutcome, ProcessSpec
from herdsman.runtime.store import MemoryStore, NewRun
from herdsman.runtime.supervisor import NotAdmitting, RunConflict, RunNotFound, Supervisor
from herdsman.runtime.worktrees.manager import METADATA
from herdsman.sim.fuzz.invariants import Checker, Violation
from herdsman.sim.fuzz.scenario import Scenario, ScenarioError
from herdsman.sim.replay import ARRIVAL, Driver, drive, shuffle_trio
from herdsman.sim.workload import SYNTHETIC_EXIT_CODES, Attempt, RunPlan, Workload
from herdsman.trace import TraceHeader, TraceWriter, format_time

__all__ = ["CONFIG_PATH", "STARTED_AT", "Verdict", "run_scenario"]

#: The simulated clock's start (unix seconds), a whole second.
STARTED_AT = 1_795_000_000.0
CONFIG_PATH = Path("/herdsman-sim/supervisor.toml")
#: How long a usage limit without a reset time, or a quota window, may hold runs.
_LONGEST_REST = 3600.0
_AGENT_FILE = "agent-notes-{run}.txt"
#: How long (simulated) a supervisor told to stop, or killed, may take to stop.
STOP_GRACE = 600.0


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


def run_scenario(scenario: Scenario) -> Verdict:
    """Run ``scenario`` and check it; the same verdict for the same scenario in any process."""
    # The seed also picks trio's wake-up order: one more thing a seed varies,
    # and a reproduction must not depend on (docs/simulator.md, "Determinism").
    shuffle_trio(scenario.seed)
    began = time.perf_counter()
    clock = trio.testing.MockClock()  # never jumps by itself: the driver moves it
    with Patcher() as patcher:
        assert patcher.fs is not None
        fuzz = _Fuzz(scenario, patcher.fs)
        raised: list[BaseException] = []

        def run() -> None:
            try:
                trio.run(fuzz.run, clock, clock=clock)
            except BaseException as error:  # handed to the caller's thread
                raised.append(error)
            finally:
                fuzz.done.set()

        # In a thread of its own: a supervisor that will not stop (a task
        # stuck in a shielded scope) keeps trio.run from returning; its
        # verdict is given all the same and the thread, asleep for ever, is
        # abandoned.
        threading.Thread(target=run, name=f"fuzz-{scenario.seed}", daemon=True).start()
        fuzz.done.wait()
        if raised:
            error = raised[0]
            if isinstance(error, ScenarioError) or not isinstance(error, Exception):
                raise error
            # The supervisor itself fell over: a finding too.
            fuzz.checker.violations.append(Violation("raised", clock.current_time(), _what(error)))
    return Verdict(
        scenario,
        tuple(fuzz.checker.violations),
        tuple(sink.text for sink in fuzz.sinks),
        fuzz.span,
        time.perf_counter() - began,
        fuzz.faults + fuzz.git_injected - fuzz.git.pending_failures,
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
            for attempt in event["attempts"]:
                work += float(attempt["duration"])
                if attempt["outcome"] == "usage_limited":
                    rests += max(_LONGEST_REST, float(attempt.get("resets_in", 0.0)))
        elif event["kind"] == "disk_full":
            work += float(event["seconds"])
    return last + work + rests + 300.0 * runs + 120.0


class _Sink(io.StringIO):
    """A trace file's stand-in: keeps the text and shows each line to the checker."""

    def __init__(self, checker: Checker) -> None:
        super().__init__()
        self._checker = checker
        self._pending = ""
        self.text = ""
        #: False once its supervisor has crashed: what it writes while dying is lost.
        self.live = True

    def write(self, text: str) -> int:
        if not self.live:
            return len(text)
        self.text += text
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            obj = json.loads(line)
            if "herdsman_trace" in obj:
                self._checker.header(obj["config"])
            else:
                self._checker.event(obj.pop("event"), obj)
        return len(text)


class _CheckedGit(FakeGit):
    """The fake git, slowed down, telling the checker of every worktree removal.

    Each call takes ``latency`` seconds plus a microsecond per call before
    it: two calls never end at one instant, where trio's timer order (by
    object id) would decide which goes first.
    """

    def __init__(self, on_remove: Callable[[Path], None], latency: float) -> None:
        calls = itertools.count()
        super().__init__(latency=(lambda _: latency + next(calls) * 1e-6) if latency else None)
        self._on_remove = on_remove

    async def remove_worktree(self, repo: Path, path: Path) -> None:
        # Before and after: a run of its conversation may not be recorded
        # while the removal is under way either.
        self._on_remove(path)
        await super().remove_worktree(repo, path)
        self._on_remove(path)


class _Runner(Driver):
    """The replay's fake runner, plus what agents do that faults are made of.

    It tells the checker of each spawn, leaves files in the worktrees of a
    run marked ``dirty`` (what an agent's edits look like to git), and puts
    the reset time on a usage limit.
    """

    def __init__(self, workload: Workload, fuzz: _Fuzz) -> None:
        super().__init__(workload)
        self._fuzz = fuzz
        self._tries: dict[str, int] = {}

    async def execute(self, spec: ProcessSpec, **options: Any) -> ProcessOutcome:
        """The replay's fake run (``options``: its cancel handle and task status), plus faults."""
        run_id = spec.env["HERDSMAN_RUN_ID"]
        fuzz = self._fuzz
        fuzz.checker.spawned(run_id)
        tries = self._tries.get(run_id, 0)
        self._tries[run_id] = tries + 1
        submit = fuzz.submits.get(run_id, {})
        repos = spec.env.get("HERDSMAN_REPOS")
        if submit.get("dirty") and repos is not None:
            fuzz.leave_files(Path(repos), run_id)
        ended = await super().execute(spec, **options)
        attempts = submit.get("attempts", [])
        resets_in = attempts[tries].get("resets_in") if tries < len(attempts) else None
        if ended.usage_limit is not None and resets_in is not None:
            limit = attrs.evolve(ended.usage_limit, resets_at=fuzz.wall() + float(resets_in))
            ended = attrs.evolve(ended, usage_limit=limit)
        return ended


@attrs.define
class _Life:
    """One life of the supervisor: it, its ledger, its trace, the scope that ends it."""

    supervisor: Supervisor
    store: MemoryStore
    sink: _Sink
    scope: trio.CancelScope


class _Fuzz:
    """One scenario's run: the parts, the faults, and the checks after each event."""

    def __init__(self, scenario: Scenario, fs: FakeFilesystem) -> None:
        self.scenario = scenario
        self.fs = fs
        self.sinks: list[_Sink] = []
        # The first submit of each run says how it goes; one sent again is the same run.
        self.submits: dict[str, Mapping[str, Any]] = {}
        for event in scenario.events:
            if event["kind"] == "submit":
                self.submits.setdefault(event["run"]["id"], event)
        self.checker = Checker(
            trio.current_time, {run_id: event["run"] for run_id, event in self.submits.items()}
        )
        #: Set once the verdict is in (the run ended, or was abandoned).
        self.done = threading.Event()
        #: Whether a supervisor failed to stop: the run is then abandoned.
        self._stuck = False
        #: Faults delivered, git failures apart; git failures injected.
        self.faults = self.git_injected = 0
        self.git = _CheckedGit(self._removing, scenario.git_latency)
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

    def wall(self) -> float:
        """The simulated unix time."""
        return STARTED_AT + trio.current_time()

    # -- the run -----------------------------------------------------------

    async def run(self, clock: trio.testing.MockClock) -> None:
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
        runner = _Runner(self._workload(), self)
        self._runner = runner
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._start(MemoryStore())
            for order, event in enumerate(self.scenario.events):
                runner.push(float(event["t"]), ARRIVAL, order, self._action(event))
            runner.driving = True
            await drive(runner, _Current(self), clock, self._after)
            runner.driving = False
            if not self.checker.violations:
                self.checker.drained("when nothing was left that could start them")
            self.span = trio.current_time()
            # From here on nothing drives the clock: let it jump, so that a
            # supervisor that will not stop is given up on (in simulated time).
            clock.autojump_threshold = 0
            life = self._life
            assert life is not None
            life.sink.live = False  # what stopping it traces is not checked
            if not self._stuck:
                life.scope.cancel()
                await self._stopped(life, "told to stop")
            if self._stuck:
                # Its stuck task keeps this nursery open for ever: give the
                # verdict now and leave this thread asleep (no timer, no jumps).
                clock.autojump_threshold = float("inf")
                self.done.set()
                await trio.sleep_forever()
            nursery.cancel_scope.cancel()

    async def _stopped(self, life: _Life, how: str) -> bool:
        """Whether ``life``'s supervisor, ``how``, stops within the grace; a violation if not."""
        with trio.move_on_after(STOP_GRACE):
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
                [
                    # Spawned, so counted against budgets: the exit code of
                    # its outcome unless the scenario names one.
                    Attempt(
                        float(a["duration"]),
                        a["outcome"],
                        a.get("exit_code", SYNTHETIC_EXIT_CODES[a["outcome"]]),
                    )
                    for a in event["attempts"]
                ],
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
            run_sync=inline,
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

        async def act() -> None:
            assert self._life is not None
            if kind == "git_failure":
                self.git_injected += 1  # a fault once a call meets it
            elif kind != "submit" or event.get("again"):
                self.faults += 1
            supervisor = self._life.supervisor
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

        return act

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
        """Start a supervisor again on ``life``'s ledger once it has shut down."""
        await life.supervisor.finished.wait()
        if self._life is not life or not self._runner.driving:
            return  # killed meanwhile (a crash restarted it), or the scenario is over
        # Everything it recorded is kept (a clean stop): what a restart
        # restates is checked as after a crash.
        self.checker.crashed()
        self._fix_config()
        await self._start(life.store)
        self.checker.restarted()

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
        life.scope.cancel()
        # Its dying tasks may wait on timers (nothing else happens meanwhile).
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, trio.testing.MockClock)
        clock.autojump_threshold = 0
        try:
            stopped = await self._stopped(life, "killed")
        finally:
            clock.autojump_threshold = float("inf")
        if not stopped:
            return  # the run is abandoned: nothing can restart it
        self._fix_config()
        await self._start(store)
        self.checker.restarted()

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
        return [p.name for p in repos.iterdir() if (p / ".git").exists()]

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
            records = [life.store.get(run_id) for run_id in checker.run_ids]
            status = life.supervisor.status()
            checker.settled(records, status)
        for path, run_id in list(self._left.items()):
            if not path.exists():
                del self._left[path]
                checker.fail(
                    "dirty worktree removed", f"{path.parent} held {path.name}, left by {run_id}"
                )
        if self.wall() > self._deadline:
            # Past the bound nothing more may happen: stop, finished or not.
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
        while runs are queued or running, its next timer (a slow git call ends)."""
        fuzz = self._fuzz
        assert fuzz._life is not None
        recheck = fuzz._life.supervisor.account_recheck_at
        if recheck is not None or not fuzz.checker.unsettled():
            return recheck
        # No later than just past the bound, where the checks stop the drive.
        bound = fuzz._deadline - STARTED_AT + 1.0
        to_timer = trio.lowlevel.current_statistics().seconds_to_next_deadline
        return min(trio.current_time() + to_timer, max(bound, trio.current_time()))
