"""What the fuzz puts in the supervisor's place: its trace sink, its git, its runner, its life.

Each stands in for a real part and tells the fuzz's checker what it sees
(:mod:`herdsman.sim.fuzz.harness` runs the scenario with them).
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from herdsman.core.outcome import Outcome
from herdsman.runtime.git.fake import FakeGit
from herdsman.runtime.runner import ProcessOutcome, ProcessSpec
from herdsman.runtime.store import MemoryStore
from herdsman.runtime.supervisor import Supervisor
from herdsman.sim.fuzz.agent_faults import agent_end
from herdsman.sim.fuzz.invariants import Checker
from herdsman.sim.fuzz.removal_waits import RemovalWaits
from herdsman.sim.replay import Driver
from herdsman.sim.workload import Workload

if TYPE_CHECKING:
    from herdsman.sim.fuzz.harness import _Fuzz


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

    def __init__(
        self,
        on_remove: Callable[[Path], None],
        latency: float,
        removals: RemovalWaits,
        on_begin: Callable[[Path], None],
    ) -> None:
        calls = itertools.count()
        super().__init__(latency=(lambda _: latency + next(calls) * 1e-6) if latency else None)
        self._on_remove = on_remove
        self._removals = removals
        self._on_begin = on_begin

    async def remove_worktree(self, repo: Path, path: Path) -> None:
        # Before and after: a run of its conversation may not be recorded
        # while the removal is under way either.
        self._on_remove(path)
        self._removals.began(path)
        self._on_begin(path)
        try:
            await super().remove_worktree(repo, path)
        finally:
            self._removals.ended(path)
        self._on_remove(path)


CANCELLED = Outcome.CANCELLED


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
        attempt = attempts[tries] if tries < len(attempts) else {}
        resets_in = attempt.get("resets_in")
        if ended.usage_limit is not None and resets_in is not None:
            limit = attrs.evolve(ended.usage_limit, resets_at=fuzz.wall() + float(resets_in))
            ended = attrs.evolve(ended, usage_limit=limit)
        warning = attempt.get("warning")
        usage = ended.usage
        if usage is not None and usage.near_limit is not None and warning is not None:
            near = attrs.evolve(usage.near_limit, resets_at=fuzz.wall() + warning["resets_in"])
            ended = attrs.evolve(ended, usage=attrs.evolve(usage, near_limit=near))
        fuzz.checker.agent_ended(run_id, agent_end(attempt, stopped=ended.status is CANCELLED))
        return ended


@attrs.define
class _Life:
    """One life of the supervisor: it, its ledger, its trace, the scope that ends it."""

    supervisor: Supervisor
    store: MemoryStore
    sink: _Sink
    scope: trio.CancelScope
