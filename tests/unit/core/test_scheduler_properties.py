"""Property tests: the scheduling core against a deliberately simple reference model.

The model (:class:`ReferenceModel`) is written from the contract in docs/scheduling.md
("When a run may start"), not from the core's lanes and heaps: a list of queued runs
in submission order, a list of running runs, and a quadratic scan that starts
the earliest-submitted free run until no run is free. A run is *free* when

(a) its provider has a free slot (a provider missing from the caps has none),
(b) the global cap, if any, has a free slot,
(c) no running or held run shares one of its exclusion keys, and
(d) no earlier-submitted, still-queued run shares one of its keys, and
(e) the start gate, if any, is open for its provider (the gate here is a
    count of further starts allowed per provider, standing in for accounts).

:class:`SchedulerMachine` drives the real :class:`Scheduler` and the model with
the same random events (submit, finish, requeue, hold, cancel, limit changes,
agent-exclusivity toggles, gate changes), calling ``take_startable()`` after
every event as the runtime does, and checks after every step that the core
started exactly the runs the model starts, in the same order, and that every
observable count and state agrees. A *held* run (``Scheduler.hold``: a fleet
member's refused claim) is in the model's ``held`` list: it blocks its keys as
a running run does, counts against no cap, and is never started until
``requeue`` puts it back in the queue (or ``cancel`` withdraws it).
Pools of providers, workspaces, conversations and agents are tiny on purpose,
so lanes collide and caps bind all the time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from herdsman.core import (
    CancelOutcome,
    Limits,
    RunRequest,
    RunState,
    Scheduler,
    SchedulerError,
    exclusion_keys,
)

# -- pools and strategies -----------------------------------------------------

#: ``px`` never appears in the caps: it has no slots and its runs never start.
PROVIDERS = ("p0", "p1", "px")
WORKSPACES = ("default", "w1", "w2")
CONVERSATIONS = (None, "c0", "c1", "c2")
AGENTS = (None, "a0", "a1", "a2")
# A small tree, so that containment (in both directions) and disjoint
# siblings all come up often.
CWDS = (None, None, "/r", "/r/a", "/r/a/x", "/r/b", "/s", "/")

# Zero caps are legal but stall everything, so most caps leave some room.
caps_st = st.sampled_from((1, 2, 3, 0, 4))
limits_st = st.builds(
    Limits,
    provider_caps=st.fixed_dictionaries({"p0": caps_st}, optional={"p1": caps_st}),
    global_cap=st.sampled_from((None, 2, 3, 1, 0, 4, 5)),
)
# Everything but the id, which the machine assigns (fresh or reused). Some
# values appear twice to make collisions likelier; the first value is where
# shrinking heads.
run_fields_st = st.fixed_dictionaries(
    {
        "provider": st.sampled_from(("p0", "p1", "p0", "p1", "p0", "p1", "px")),
        "workspace": st.sampled_from((*WORKSPACES, "default")),
        "conversation": st.sampled_from(CONVERSATIONS),
        "agent": st.sampled_from((*AGENTS, "a0")),
        "cwd": st.sampled_from(CWDS),
    }
)


# -- the reference model ------------------------------------------------------


@dataclass
class ReferenceModel:
    """The contract, computed the slow and obvious way."""

    limits: Limits
    agent_exclusive: bool
    queued: list[RunRequest] = field(default_factory=list)  # submission order
    running: list[RunRequest] = field(default_factory=list)  # start order
    held: list[RunRequest] = field(default_factory=list)  # hold order
    submitted_at: dict[str, int] = field(default_factory=dict)  # id -> submission number
    submissions: int = 0
    # Further starts the gate allows per provider; a provider absent is not gated.
    gate: dict[str, int] | None = None

    def keys(self, run: RunRequest) -> set[str]:
        return set(exclusion_keys(run, agent_exclusive=self.agent_exclusive))

    def cap(self, provider: str) -> int:
        return self.limits.provider_caps.get(provider, 0)

    def running_on(self, provider: str) -> int:
        return sum(1 for r in self.running if r.provider == provider)

    def is_live(self, run_id: str) -> bool:
        return any(r.id == run_id for r in self.queued + self.running + self.held)

    def state_of(self, run_id: str) -> RunState | None:
        if any(r.id == run_id for r in self.queued):
            return RunState.QUEUED
        if any(r.id == run_id for r in self.running):
            return RunState.RUNNING
        if any(r.id == run_id for r in self.held):
            return RunState.HELD
        return None

    # Each reason a queued run may not start, as a separate test so a failure
    # message can say which rule was broken.

    def provider_has_slot(self, run: RunRequest) -> bool:
        return self.running_on(run.provider) < self.cap(run.provider)

    def global_has_slot(self) -> bool:
        cap = self.limits.global_cap
        return cap is None or len(self.running) < cap

    @staticmethod
    def overlap(a: RunRequest, b: RunRequest) -> bool:
        """Whether one run's working directory contains the other's."""
        if a.cwd is None or b.cwd is None:
            return False
        pa, pb = PurePosixPath(a.cwd), PurePosixPath(b.cwd)
        return pa == pb or pa in pb.parents or pb in pa.parents

    def conflicts(self, a: RunRequest, b: RunRequest) -> bool:
        return bool(self.keys(a) & self.keys(b)) or self.overlap(a, b)

    def blocking_running(self, run: RunRequest) -> list[RunRequest]:
        """Running and held runs that share a key with ``run``: both hold their lanes."""
        return [r for r in self.running + self.held if self.conflicts(r, run)]

    def blocking_earlier_queued(self, run: RunRequest) -> list[RunRequest]:
        earlier = self.queued[: self.queued.index(run)]
        return [r for r in earlier if self.conflicts(r, run)]

    def gate_open(self, run: RunRequest) -> bool:
        return self.gate is None or self.gate.get(run.provider, 1) > 0

    def is_free(self, run: RunRequest) -> bool:
        return (
            self.provider_has_slot(run)
            and self.global_has_slot()
            and self.gate_open(run)
            and not self.blocking_running(run)
            and not self.blocking_earlier_queued(run)
        )

    def free_runs(self) -> list[RunRequest]:
        return [r for r in self.queued if self.is_free(r)]

    def startable_providers(self) -> set[str]:
        """The ready index from scratch: providers with a queued run free on its
        lanes and a slot of their own (the gate and the global cap aside)."""
        return {
            r.provider
            for r in self.queued
            if self.provider_has_slot(r)
            and not self.blocking_running(r)
            and not self.blocking_earlier_queued(r)
        }

    # Events.

    def submit(self, run: RunRequest) -> None:
        assert not self.is_live(run.id)
        self.queued.append(run)
        self.submitted_at[run.id] = self.submissions
        self.submissions += 1

    def start(self, run: RunRequest) -> None:
        self.queued.remove(run)
        self.running.append(run)
        if self.gate is not None and run.provider in self.gate:
            self.gate[run.provider] -= 1

    def requeue(self, run_id: str) -> None:
        """Back to the queue (from running or held), in its place in submission order."""
        [run] = [r for r in self.running + self.held if r.id == run_id]
        if run in self.running:
            self.running.remove(run)
        else:
            self.held.remove(run)
        self.queued = self.in_submission_order([*self.queued, run])

    def hold(self, run_id: str) -> None:
        """Off its slot, still on its lanes."""
        self.held.append(self.finish(run_id))

    def finish(self, run_id: str) -> RunRequest:
        [run] = [r for r in self.running if r.id == run_id]
        self.running.remove(run)
        return run

    def cancel_waiting(self, run_id: str) -> None:
        """Withdraw a queued or held run."""
        self.queued = [r for r in self.queued if r.id != run_id]
        self.held = [r for r in self.held if r.id != run_id]

    def expected_starts(self) -> list[RunRequest]:
        """What ``take_startable`` must return, computed on a scratch copy.

        Greedy: start the earliest-submitted free run, then look again from
        the top, until no queued run is free.
        """
        scratch = ReferenceModel(
            self.limits,
            self.agent_exclusive,
            list(self.queued),
            list(self.running),
            list(self.held),
            dict(self.submitted_at),
            self.submissions,
            None if self.gate is None else dict(self.gate),
        )
        started = []
        while free := scratch.free_runs():
            scratch.start(free[0])
            started.append(free[0])
        return started

    # Views comparable with the core's.

    def in_submission_order(self, runs: Iterable[RunRequest]) -> list[RunRequest]:
        return sorted(runs, key=lambda r: self.submitted_at[r.id])

    def queued_by_provider(self) -> dict[str, int]:
        return _count(r.provider for r in self.queued)

    def running_by_provider(self) -> dict[str, int]:
        return _count(r.provider for r in self.running)

    def held_by_provider(self) -> dict[str, int]:
        return _count(r.provider for r in self.held)

    def queued_by_lane(self) -> dict[str, int]:
        lanes: list[str] = []
        for run in self.queued:
            keys = sorted(self.keys(run))
            lanes.extend(keys or [f"run:{run.workspace}/{run.id}"])
        return _count(lanes)


def _count(items: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def _describe(runs: Iterable[RunRequest]) -> list[str]:
    return [
        f"{r.id}({r.provider} ws={r.workspace} conv={r.conversation} agent={r.agent} cwd={r.cwd})"
        for r in runs
    ]


class CountingGate:
    """A start gate that lets through a fixed number of starts per provider."""

    def __init__(self, allowed: dict[str, int]) -> None:
        self.allowed = allowed

    def can_start(self, provider: str) -> bool:
        return self.allowed.get(provider, 1) > 0

    def started(self, run: RunRequest) -> None:
        if run.provider in self.allowed:
            assert self.allowed[run.provider] > 0, f"{run.id} started through a closed gate"
            self.allowed[run.provider] -= 1


gate_st = st.none() | st.dictionaries(
    st.sampled_from(PROVIDERS), st.integers(min_value=0, max_value=3), max_size=2
)


# -- the state machine --------------------------------------------------------


class SchedulerMachine(RuleBasedStateMachine):
    """Random events against the core and the model; the two must never disagree.

    ``make_scheduler`` is a hook so a throwaway script can point the machine at
    a deliberately broken scheduler and check that it fails.
    """

    make_scheduler: Callable[..., Scheduler] = Scheduler

    def __init__(self) -> None:
        super().__init__()
        self.sched: Scheduler
        self.model: ReferenceModel
        self.next_id = 0
        # Ids that were queued or running once and are gone: reusable, and
        # "unknown" to the scheduler.
        self.retired: list[str] = []
        # Per provider, how far a lowered cap may still be exceeded by runs
        # that were running when it was lowered (never raised by a start).
        self.over_cap_allowance: dict[str, int] = {}
        self.global_allowance = 0
        # Runs that were running or held when agent exclusivity was switched
        # on: only they may share an agent key while running or held.
        self.grandfathered: set[str] = set()
        # The gate's remaining starts per provider (None: no gate), shared with
        # the CountingGate each settle() hands the scheduler.
        self.gate: dict[str, int] | None = None

    # -- plumbing --------------------------------------------------------------

    def settle(self) -> list[RunRequest]:
        """Call ``take_startable`` as the runtime does after each event, and check it."""
        model = self.model
        # The event just handled kept the ready index exact, before any start.
        self.index_agrees()
        expected = model.expected_starts()
        gate = None if self.gate is None else CountingGate(self.gate)
        started = self.sched.take_startable(gate)
        for run in started:
            # Check each start against the rules as they stood at that moment,
            # so a failure names the rule, before comparing with the model.
            assert run not in model.held, f"started {run.id} which is held"
            assert run in model.queued, f"started {run} which is not queued"
            assert model.provider_has_slot(run), (
                f"started {run.id} with provider {run.provider} at its cap "
                f"({model.running_on(run.provider)}/{model.cap(run.provider)})"
            )
            assert model.global_has_slot(), (
                f"started {run.id} with the global cap full "
                f"({len(model.running)}/{model.limits.global_cap})"
            )
            assert not model.blocking_running(run), (
                f"started {run.id} while {_describe(model.blocking_running(run))} "
                "holding one of its keys are running"
            )
            assert not model.blocking_earlier_queued(run), (
                f"started {run.id} ahead of earlier queued "
                f"{_describe(model.blocking_earlier_queued(run))} on one of its keys"
            )
            assert model.gate_open(run), f"started {run.id} through a closed gate"
            model.start(run)
        leftover = model.free_runs()
        assert not leftover, f"after take_startable, {_describe(leftover)} are free but queued"
        assert started == expected, (
            f"take_startable started {_describe(started)}, the model starts {_describe(expected)}"
        )
        assert self.gate == model.gate, "the gate saw other starts than the model"
        return started

    def retire(self, run_id: str) -> None:
        self.retired.append(run_id)
        self.grandfathered.discard(run_id)

    def queued_ids(self) -> list[str]:
        return [r.id for r in self.model.queued]

    def running_ids(self) -> list[str]:
        return [r.id for r in self.model.running]

    def held_ids(self) -> list[str]:
        return [r.id for r in self.model.held]

    def assert_unchanged(self, before: tuple[Any, ...]) -> None:
        assert self.observe() == before

    def observe(self) -> tuple[Any, ...]:
        s = self.sched
        return (
            s.snapshot(),
            list(s.queued_runs()),
            list(s.running_runs()),
            list(s.held_runs()),
            s.limits,
            s.agent_exclusive,
        )

    # -- setup -----------------------------------------------------------------

    @initialize(limits=limits_st, agent_exclusive=st.booleans())
    def setup(self, limits: Limits, agent_exclusive: bool) -> None:
        self.sched = type(self).make_scheduler(limits, agent_exclusive=agent_exclusive)
        self.model = ReferenceModel(limits, agent_exclusive)
        assert self.sched.take_startable() == []

    # -- events ----------------------------------------------------------------

    @rule(batch=st.lists(run_fields_st, min_size=1, max_size=2))
    def submit_new(self, batch: list[dict[str, Any]]) -> None:
        """One or two submissions, each its own event followed by ``take_startable``."""
        for fields in batch:
            run = RunRequest(id=f"r{self.next_id}", **fields)
            self.next_id += 1
            self.sched.submit(run)
            self.model.submit(run)
            self.settle()

    @precondition(lambda self: self.retired)
    @rule(data=st.data(), fields=run_fields_st)
    def submit_reused_id(self, data: st.DataObject, fields: dict[str, Any]) -> None:
        """A finished or cancelled id may be submitted again (maybe on other lanes)."""
        run_id = data.draw(st.sampled_from(self.retired), label="reused id")
        self.retired.remove(run_id)
        run = RunRequest(id=run_id, **fields)
        self.sched.submit(run)
        self.model.submit(run)
        self.settle()

    @precondition(lambda self: self.model.running)
    @rule(data=st.data(), count=st.integers(min_value=1, max_value=3))
    def finish(self, data: st.DataObject, count: int) -> None:
        """One to three runs end, each its own event followed by ``take_startable``."""
        for _ in range(count):
            if not self.model.running:
                return
            run_id = data.draw(st.sampled_from(self.running_ids()), label="finish")
            self.sched.finish(run_id)
            run = self.model.finish(run_id)
            self.retire(run_id)
            # A finish may only use up the over-cap allowance, never add to it.
            provider = run.provider
            self.over_cap_allowance[provider] = min(
                self.over_cap_allowance.get(provider, 0), self.model.running_on(provider)
            )
            self.global_allowance = min(self.global_allowance, len(self.model.running))
            self.settle()

    def lower_allowances(self) -> None:
        """A run left its slot: what a lowered cap let run over it shrinks with it."""
        for provider in PROVIDERS:
            self.over_cap_allowance[provider] = min(
                self.over_cap_allowance.get(provider, 0), self.model.running_on(provider)
            )
        self.global_allowance = min(self.global_allowance, len(self.model.running))

    @precondition(lambda self: self.model.running)
    @rule(data=st.data())
    def hold(self, data: st.DataObject) -> None:
        """A running run is held (a fleet member's claim of it was refused): lanes, no slot."""
        run_id = data.draw(st.sampled_from(self.running_ids()), label="hold")
        self.sched.hold(run_id)
        self.model.hold(run_id)
        assert self.sched.state_of(run_id) is RunState.HELD
        self.lower_allowances()
        self.settle()

    @precondition(lambda self: self.model.running or self.model.held)
    @rule(data=st.data())
    def requeue(self, data: st.DataObject) -> None:
        """A running or held run goes back to its place in the queue (out of quota, refused)."""
        run_id = data.draw(st.sampled_from(self.running_ids() + self.held_ids()), label="requeue")
        self.sched.requeue(run_id)
        self.model.requeue(run_id)
        # Running again later, it obeys exclusivity like any other run.
        self.grandfathered.discard(run_id)
        self.lower_allowances()
        self.settle()

    @rule(gate=gate_st)
    def set_gate(self, gate: dict[str, int] | None) -> None:
        """The gate opens, closes or changes what it allows (accounts freeing up, exhausting)."""
        self.gate = None if gate is None else dict(gate)
        self.model.gate = None if gate is None else dict(gate)
        self.settle()

    @precondition(lambda self: self.model.queued or self.model.held)
    @rule(data=st.data())
    def cancel_waiting(self, data: st.DataObject) -> None:
        """A queued or held run is withdrawn: it never starts, a held one frees its lanes."""
        run_id = data.draw(st.sampled_from(self.queued_ids() + self.held_ids()), label="cancel")
        assert self.sched.cancel(run_id) is CancelOutcome.REMOVED
        self.model.cancel_waiting(run_id)
        self.retire(run_id)
        self.settle()

    @rule(limits=limits_st)
    def set_limits(self, limits: Limits) -> None:
        self.sched.set_limits(limits)
        self.model.limits = limits
        # Runs above a lowered cap keep running; record how far over it may be.
        for provider in PROVIDERS:
            self.over_cap_allowance[provider] = self.model.running_on(provider)
        self.global_allowance = len(self.model.running)
        assert self.sched.limits == limits
        self.settle()

    @rule(agent_exclusive=st.booleans())
    def set_agent_exclusive(self, agent_exclusive: bool) -> None:
        was = self.model.agent_exclusive
        self.sched.set_agent_exclusive(agent_exclusive)
        self.model.agent_exclusive = agent_exclusive
        if agent_exclusive and not was:
            # Held runs keep their lanes too: they are grandfathered alike.
            self.grandfathered = set(self.running_ids() + self.held_ids())
        elif not agent_exclusive:
            self.grandfathered = set()
        assert self.sched.agent_exclusive is agent_exclusive
        self.settle()

    @rule(data=st.data(), fields=run_fields_st)
    def misuse_changes_nothing(self, data: st.DataObject, fields: dict[str, Any]) -> None:
        """Calls that must leave the scheduler as it was, one of them per step.

        Submitting a live id, and finishing or holding a run that is not
        running (queued, held, gone), raise :class:`SchedulerError`, as does
        requeueing one neither running nor held; cancelling a running run
        reports RUNNING and leaves it running; cancelling an unknown,
        finished or cancelled id reports UNKNOWN; a second ``take_startable``
        starts nothing.
        """
        live = [*self.queued_ids(), *self.running_ids(), *self.held_ids()]
        not_running = [*self.queued_ids(), *self.held_ids(), *self.retired, "never-submitted"]
        unknown = [*self.retired, "never-submitted"]
        calls = [
            "finish_not_running",
            "hold_not_running",
            "requeue_not_running",
            "cancel_unknown",
            "take_again",
        ]
        if live:
            calls.append("submit_duplicate")
        if self.model.running:
            calls.append("cancel_running")
        call = data.draw(st.sampled_from(calls), label="misuse")
        before = self.observe()
        if call == "submit_duplicate":
            run_id = data.draw(st.sampled_from(live), label="id")
            with pytest.raises(SchedulerError):
                self.sched.submit(RunRequest(id=run_id, **fields))
        elif call == "finish_not_running":
            run_id = data.draw(st.sampled_from(not_running), label="id")
            with pytest.raises(SchedulerError):
                self.sched.finish(run_id)
        elif call == "hold_not_running":
            run_id = data.draw(st.sampled_from(not_running), label="id")
            with pytest.raises(SchedulerError):
                self.sched.hold(run_id)
        elif call == "requeue_not_running":
            not_running_or_held = [*self.queued_ids(), *self.retired, "never-submitted"]
            run_id = data.draw(st.sampled_from(not_running_or_held), label="id")
            with pytest.raises(SchedulerError):
                self.sched.requeue(run_id)
        elif call == "cancel_running":
            run_id = data.draw(st.sampled_from(self.running_ids()), label="id")
            assert self.sched.cancel(run_id) is CancelOutcome.RUNNING
            assert self.sched.state_of(run_id) is RunState.RUNNING
        elif call == "cancel_unknown":
            run_id = data.draw(st.sampled_from(unknown), label="id")
            assert self.sched.cancel(run_id) is CancelOutcome.UNKNOWN
        self.assert_unchanged(before)
        gate = None if self.gate is None else CountingGate(self.gate)
        assert self.sched.take_startable(gate) == []
        self.assert_unchanged(before)

    # -- invariants ------------------------------------------------------------

    @invariant()
    def caps_hold(self) -> None:
        model = self.model
        for provider in PROVIDERS:
            bound = max(model.cap(provider), self.over_cap_allowance.get(provider, 0))
            assert model.running_on(provider) <= bound, provider
        if model.limits.global_cap is not None:
            assert len(model.running) <= max(model.limits.global_cap, self.global_allowance)

    @invariant()
    def running_runs_share_no_key(self) -> None:
        """Lanes are exclusive among running and held runs alike."""
        model = self.model
        running = model.running + model.held
        for i, a in enumerate(running):
            for b in running[i + 1 :]:
                assert not model.overlap(a, b), ("overlapping working directories", a, b)
                shared = model.keys(a) & model.keys(b)
                if shared:
                    # Only runs already running when exclusivity came on may
                    # share a key, and only an agent key.
                    assert {a.id, b.id} <= self.grandfathered, (a, b, shared)
                    assert all(k.startswith("agent:") for k in shared), shared

    @invariant()
    def nothing_free_is_left_queued(self) -> None:
        assert self.model.free_runs() == []

    @invariant()
    def index_agrees(self) -> None:
        """The ready index, kept as events happen, is what a recomputation from scratch says."""
        if not hasattr(self, "sched"):
            return
        assert set(self.sched.startable) == self.model.startable_providers(), (
            f"ready index {sorted(self.sched.startable)}, "
            f"from scratch {sorted(self.model.startable_providers())}"
        )

    @invariant()
    def views_agree(self) -> None:
        sched, model = self.sched, self.model
        assert sched.queued_count == len(model.queued)
        assert sched.running_count == len(model.running)
        assert sched.held_count == len(model.held)
        assert list(sched.queued_runs()) == model.queued
        assert list(sched.running_runs()) == model.in_submission_order(model.running)
        assert list(sched.held_runs()) == model.held
        snap = sched.snapshot()
        assert snap.queued == len(model.queued)
        assert snap.running == len(model.running)
        assert snap.held == len(model.held)
        assert dict(snap.queued_by_provider) == model.queued_by_provider()
        assert dict(snap.running_by_provider) == model.running_by_provider()
        assert dict(snap.held_by_provider) == model.held_by_provider()
        assert dict(snap.queued_by_lane) == model.queued_by_lane()
        for provider in PROVIDERS:
            # A slot is free exactly when the model's caps, counting only
            # running runs (never held ones), leave room.
            free = model.running_on(provider) < model.cap(provider) and model.global_has_slot()
            assert sched.has_free_slot(provider) is free, provider
        ids = [*self.queued_ids(), *self.running_ids(), *self.held_ids(), *self.retired, "never"]
        for run_id in ids:
            assert sched.state_of(run_id) is model.state_of(run_id), run_id


# report_multiple_bugs=False: shrink the first failure only; with many distinct
# assertions, shrinking several at once can take minutes.
SchedulerMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, report_multiple_bugs=False
)
TestSchedulerMachine = pytest.mark.slow(SchedulerMachine.TestCase)


# -- runs submitted in their place ----------------------------------------------


class PlacedSubmissionMachine(SchedulerMachine):
    """The same events, every run submitted with an explicit ``seq``, some in their place.

    A fleet member's scheduler gets every run with the ledger's ``seq``, and
    a run another member re-queued arrives after runs submitted later than
    it: it must go where its ``seq`` puts it, as if it had been submitted
    then. The model places it so too (its queue is kept in ``seq`` order).
    """

    STEP = 1000

    def __init__(self) -> None:
        super().__init__()
        self.last_seq = 0
        self.used: set[int] = set()

    def submit_with(self, run: RunRequest, seq: int) -> None:
        self.used.add(seq)
        self.sched.submit(run, seq=seq)
        self.model.submitted_at[run.id] = seq
        self.model.queued = self.model.in_submission_order([*self.model.queued, run])
        self.settle()

    def next_seq(self) -> int:
        self.last_seq += self.STEP
        return self.last_seq

    @rule(batch=st.lists(run_fields_st, min_size=1, max_size=2))
    def submit_new(self, batch: list[dict[str, Any]]) -> None:
        for fields in batch:
            run = RunRequest(id=f"r{self.next_id}", **fields)
            self.next_id += 1
            self.submit_with(run, self.next_seq())

    @precondition(lambda self: self.retired)
    @rule(data=st.data(), fields=run_fields_st)
    def submit_reused_id(self, data: st.DataObject, fields: dict[str, Any]) -> None:
        run_id = data.draw(st.sampled_from(self.retired), label="reused id")
        self.retired.remove(run_id)
        self.submit_with(RunRequest(id=run_id, **fields), self.next_seq())

    @precondition(lambda self: self.last_seq)
    @rule(
        data=st.data(),
        fields=run_fields_st,
        back=st.integers(min_value=1, max_value=8 * STEP),
    )
    def submit_in_place(self, data: st.DataObject, fields: dict[str, Any], back: int) -> None:
        """A run whose ``seq`` is below runs already queued, running or finished."""
        seq = self.last_seq - back
        if seq <= 0 or seq in self.used:
            return
        run = RunRequest(id=f"r{self.next_id}", **fields)
        self.next_id += 1
        self.submit_with(run, seq)


PlacedSubmissionMachine.TestCase.settings = SchedulerMachine.TestCase.settings
TestPlacedSubmissionMachine = pytest.mark.slow(PlacedSubmissionMachine.TestCase)


def test_a_run_submitted_in_its_place_starts_before_later_runs_of_its_lanes() -> None:
    s = Scheduler(Limits({"p": 1}))
    s.submit(RunRequest("running", "p", conversation="c0"), seq=1)
    assert [r.id for r in s.take_startable()] == ["running"]
    s.submit(RunRequest("later", "p", conversation="c1", cwd="/r/a"), seq=30)
    s.submit(RunRequest("placed", "p", conversation="c1", cwd="/r"), seq=20)
    s.finish("running")
    assert [r.id for r in s.take_startable()] == ["placed"]
    assert [r.id for r in s.queued_runs()] == ["later"]


def test_a_directory_run_placed_ahead_holds_back_a_released_run_below_it_then_frees_it() -> None:
    s = Scheduler(Limits({"p": 1}))
    s.submit(RunRequest("busy", "p"), seq=1)
    assert [r.id for r in s.take_startable()] == ["busy"]
    # Free on its directory's lanes, it waits for a slot only.
    s.submit(RunRequest("deep", "p", cwd="/r/a"), seq=30)
    s.submit(RunRequest("placed", "p", cwd="/r"), seq=20)  # contains /r/a, submitted before
    s.finish("busy")
    assert [r.id for r in s.take_startable()] == ["placed"]
    assert s.take_startable() == []  # /r/a is inside /r: it waits
    s.finish("placed")
    assert [r.id for r in s.take_startable()] == ["deep"]


def test_a_run_placed_before_a_running_run_it_waits_for_survives_an_exclusivity_switch() -> None:
    s = Scheduler(Limits({"p": 1}))
    s.submit(RunRequest("outer", "p", cwd="/r"), seq=1000)
    assert [r.id for r in s.take_startable()] == ["outer"]
    s.submit(RunRequest("inner", "p", cwd="/r/a"), seq=999)  # before it, inside its directory
    assert s.take_startable() == []
    s.set_agent_exclusive(False)  # every lane rebuilt: "outer" still holds /r
    s.requeue("outer")
    assert [r.id for r in s.take_startable()] == ["inner"]


# -- determinism --------------------------------------------------------------

# One call as (name, argument); "finish" picks a running run and "cancel" a
# queued or running one by index into the first scheduler's (ordered) views.
op_st = st.one_of(
    st.tuples(st.just("submit"), run_fields_st),
    st.tuples(st.just("finish"), st.integers(min_value=0, max_value=20)),
    st.tuples(st.just("cancel"), st.integers(min_value=0, max_value=20)),
    st.tuples(st.just("requeue"), st.integers(min_value=0, max_value=20)),
    st.tuples(st.just("hold"), st.integers(min_value=0, max_value=20)),
    st.tuples(st.just("limits"), limits_st),
    st.tuples(st.just("exclusive"), st.booleans()),
)


def _run_both(limits: Limits, agent_exclusive: bool, ops: list[tuple[str, Any]]) -> None:
    first = Scheduler(limits, agent_exclusive=agent_exclusive)
    second = Scheduler(limits, agent_exclusive=agent_exclusive)
    for n, (name, arg) in enumerate(ops):
        outcomes = []
        if name == "submit":
            run = RunRequest(id=f"r{n}", **arg)
            first.submit(run)
            second.submit(attrs.evolve(run))  # an equal but distinct object
        elif name in ("finish", "cancel", "requeue", "hold"):
            runs = [*first.running_runs()]
            if name in ("cancel", "requeue"):
                runs += first.held_runs()
            if name == "cancel":
                runs += first.queued_runs()
            if not runs:
                continue
            run_id = runs[arg % len(runs)].id
            outcomes = [getattr(s, name)(run_id) for s in (first, second)]
        elif name == "limits":
            first.set_limits(arg)
            second.set_limits(arg)
        else:
            first.set_agent_exclusive(arg)
            second.set_agent_exclusive(arg)
        assert outcomes[:1] == outcomes[1:]
        assert first.take_startable() == second.take_startable()
        assert first.snapshot() == second.snapshot()
        assert list(first.running_runs()) == list(second.running_runs())
        assert list(first.queued_runs()) == list(second.queued_runs())
        assert list(first.held_runs()) == list(second.held_runs())


@settings(max_examples=100, deadline=None)
@given(limits=limits_st, agent_exclusive=st.booleans(), ops=st.lists(op_st, max_size=60))
def test_two_schedulers_fed_the_same_calls_decide_alike(
    limits: Limits, agent_exclusive: bool, ops: list[tuple[str, Any]]
) -> None:
    _run_both(limits, agent_exclusive, ops)


# -- pinned scenarios ---------------------------------------------------------


def test_switching_exclusivity_on_lets_running_runs_of_one_agent_finish_first() -> None:
    """Two runs of one agent run while exclusivity is off; after it comes on,
    a third run of that agent waits for both, and other lanes keep flowing."""
    sched = Scheduler(Limits({"p0": 4}), agent_exclusive=False)
    a = RunRequest("a", "p0", conversation="c0", agent="a0")
    b = RunRequest("b", "p0", conversation="c1", agent="a0")
    sched.submit(a)
    sched.submit(b)
    assert sched.take_startable() == [a, b]
    sched.set_agent_exclusive(True)
    c = RunRequest("c", "p0", conversation="c2", agent="a0")
    d = RunRequest("d", "p0", agent="a1")
    sched.submit(c)
    sched.submit(d)
    assert sched.take_startable() == [d]
    sched.finish("a")
    assert sched.take_startable() == []
    sched.finish("b")
    assert sched.take_startable() == [c]


def test_cancelled_head_does_not_block_its_lane() -> None:
    """Cancelling the head of a lane lets the next run of that lane start."""
    sched = Scheduler(Limits({"p0": 1, "p1": 1}))
    x = RunRequest("x", "p0")
    y = RunRequest("y", "p0", conversation="c0")
    z = RunRequest("z", "p1", conversation="c0", agent="a0")
    for run in (x, y, z):
        sched.submit(run)
    assert sched.take_startable() == [x]
    assert sched.cancel("y") is CancelOutcome.REMOVED
    assert sched.take_startable() == [z]


def test_requeued_run_goes_back_ahead_of_later_runs_on_its_directory() -> None:
    """A requeued run keeps its place: a later exclusive run on a containing
    directory, and a later sibling behind that, still wait for it."""
    sched = Scheduler(Limits({"p0": 4}))
    r = RunRequest("r", "p0", cwd="/r/a")
    sched.submit(r)
    assert sched.take_startable() == [r]
    x = RunRequest("x", "p0", cwd="/r")
    w = RunRequest("w", "p0", cwd="/r/b")
    sched.submit(x)
    sched.submit(w)
    assert sched.take_startable() == []
    sched.requeue("r")
    assert sched.take_startable() == [r]
    sched.finish("r")
    assert sched.take_startable() == [x]
    sched.finish("x")
    assert sched.take_startable() == [w]


def test_requeued_run_starts_before_a_later_run_of_its_conversation() -> None:
    sched = Scheduler(Limits({"p0": 1}))
    first = RunRequest("first", "p0", conversation="c")
    second = RunRequest("second", "p0", conversation="c")
    other = RunRequest("other", "p0")
    sched.submit(first)
    assert sched.take_startable() == [first]
    sched.submit(second)
    sched.submit(other)
    sched.requeue("first")
    assert sched.state_of("first") is RunState.QUEUED
    assert sched.take_startable() == [first]
    sched.finish("first")
    assert sched.take_startable() == [second]


def test_a_gate_closing_mid_take_stops_that_provider_only() -> None:
    sched = Scheduler(Limits({"p0": 4, "p1": 4}))
    runs = [RunRequest(f"a{i}", "p0") for i in range(3)] + [RunRequest("b0", "p1")]
    for run in runs:
        sched.submit(run)
    gate = CountingGate({"p0": 2})
    assert sched.take_startable(gate) == [runs[0], runs[1], runs[3]]
    assert gate.allowed == {"p0": 0}
    assert sched.take_startable(CountingGate({"p0": 1})) == [runs[2]]
