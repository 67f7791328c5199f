"""The sans-IO scheduling core: which queued run may start now.

Why this module is long: the lanes, their FIFOs and the ready heaps are one
data structure whose invariants every operation keeps (below), on the hot
path of every submit, start and finish; split, the invariants would be read
across files and each call would pay another lookup.

The contract (see docs/scheduling.md) in one paragraph: a run may start when
its provider and the global cap have a free slot, no running run shares one of
its exclusion keys, and no earlier-submitted queued run shares one of its keys.
Among runs free to start the earliest submitted goes first, and a busy lane
never holds up runs on other lanes.

How it stays cheap. Every key (a *lane*) keeps a FIFO of its queued runs and a
count of running runs holding it. A run is *ready* when it heads every lane it
is on and none of those lanes is held; a run is on at most two lanes plus its
working directory's (below), so that test is O(1) — O(depth) with a cwd.

Working directories use multi-granularity locking: a run holds its own
directory's lane *exclusively* and every ancestor's lane in *intention*
mode. Exclusive conflicts with both, intention only with exclusive, so runs
conflict exactly when one directory contains the other. FIFO holds per lane:
an exclusive waiter waits for every earlier waiter, an intention waiter only
for earlier exclusive ones. Whether a lane blocks a waiter only ever changes
from blocked to free (blockers are always earlier runs), so each lane
releases its intention waiters once, in order, as a prefix: amortised O(1)
per waiter and lane.

Ready runs wait in one heap per provider ordered by submission sequence.
Readiness can only change for waiters of a lane whose holders or front
changed (a finish, a cancel), so each event touches O(depth) lanes and does
O(log n) heap work per run it frees. Cancelled runs are left in place as tombstones and dropped
when they reach a lane's front or a heap's top (amortised O(1)).

The *ready index* (:attr:`Scheduler.startable`) holds the providers whose
ready heap is not empty and that have a free slot of their own, kept as
runs are offered, start, finish, are held or re-queued and as caps change.
Picking the next start compares the heads of the indexed heaps only, and a
driver (the lifecycle's dispatch, its wakeups) reads the index instead of
asking every provider's slots and gate at every event: a provider whose
runs all wait on a lane or a slot is not even looked at. O(P) at most in
configured providers, never in queued runs. One method (``_index``) decides
whether a provider is in it, and drops its heap's stale tops on the way;
each provider's slots, counts and heap are one object its runs point at.

A started run can be *held* (:meth:`Scheduler.hold`): a fleet member whose
claim of it was refused keeps it on its lanes, as a holder, so FIFO per lane
holds, but gives its slot back. Holding touches no lane and no heap, so it is
O(1) and leaves the hot paths (submit, start, finish) as they were.

No I/O, no clock, no randomness, and no iteration over hash-ordered sets: the
same calls produce the same decisions in any process.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Protocol

import attrs

from herdsman.core.runs import RunRequest, busy_keys, exclusion_keys, intention_keys


class RunState(enum.Enum):
    """Where a run the scheduler knows about stands."""

    QUEUED = "queued"
    RUNNING = "running"
    #: Started, then held back without a process (:meth:`Scheduler.hold`): it
    #: keeps its lanes and is never offered, but takes no slot.
    HELD = "held"


# The states read and set with every submit, start and finish, bound once:
# reading a member through its enum class costs five times a module global
# (EnumType's attribute lookup), a few per cent of a simulated run.
_QUEUED, _RUNNING = RunState.QUEUED, RunState.RUNNING


class CancelOutcome(enum.Enum):
    """What :meth:`Scheduler.cancel` did."""

    #: The run was queued (or held) and is gone; it will never start.
    REMOVED = "removed"
    #: The run is executing: the caller must stop it, then call ``finish``.
    RUNNING = "running"
    #: No queued or running run has this id.
    UNKNOWN = "unknown"


class SchedulerError(Exception):
    """A call that breaks the core's protocol (a bug in the caller)."""


class StartGate(Protocol):
    """A further condition on starts, consulted by :meth:`Scheduler.take_startable`.

    The account core is one: a provider whose accounts are all exhausted or at
    their caps may start nothing, whatever its slots say. ``can_start`` must
    answer for the provider as a whole (any of its ready runs), so a closed
    gate never blocks one run while letting a later one of the same provider
    by; ``started`` is told of each start, in order, so the answer can change.
    """

    def can_start(self, provider: str) -> bool:
        """Whether ``provider`` may start one more run now."""
        ...

    def started(self, run: RunRequest) -> None:
        """``run`` was just started (its provider's gate was open)."""
        ...


def _copy_caps(caps: Mapping[str, int]) -> dict[str, int]:
    return dict(caps)


@attrs.frozen
class Limits:
    """Slot limits. A provider missing from ``provider_caps`` has no slots.

    ``global_cap`` of ``None`` means no machine-wide cap.
    """

    provider_caps: Mapping[str, int] = attrs.field(factory=dict, converter=_copy_caps)
    global_cap: int | None = None

    def __attrs_post_init__(self) -> None:
        for provider, cap in self.provider_caps.items():
            if cap < 0:
                raise ValueError(f"provider {provider!r}: cap must be >= 0, got {cap}")
        if self.global_cap is not None and self.global_cap < 0:
            raise ValueError(f"global cap must be >= 0, got {self.global_cap}")


@attrs.frozen
class SchedulerSnapshot:
    """A consistent view of the queue, for status pages and tests.

    ``queued_by_lane`` counts queued runs per exclusion key; runs without a
    conversation or agent key appear as ``run:<workspace>/<id>``. Held runs
    (:meth:`Scheduler.hold`) count in ``held`` only: neither queued nor running.
    """

    queued: int
    running: int
    queued_by_provider: Mapping[str, int]
    running_by_provider: Mapping[str, int]
    queued_by_lane: Mapping[str, int]
    held: int = 0
    held_by_provider: Mapping[str, int] = attrs.field(factory=dict)


class _Lane:
    """One exclusion key: its waiters in submission order, and its holders.

    Conversation and agent lanes only ever see exclusive requests; a
    directory's lane also sees intention requests from runs below it.
    """

    __slots__ = ("ix_holders", "ix_pending", "ix_queue", "key", "live", "x_holders", "x_queue")

    def __init__(self, key: str) -> None:
        self.key = key
        # Waiters may leave tombstones (cancelled or started runs) anywhere.
        self.x_queue: deque[_Entry] = deque()
        self.ix_queue: deque[_Entry] = deque()
        # Intention waiters this lane has not released yet (a suffix of ix_queue).
        self.ix_pending: deque[_Entry] = deque()
        # Live exclusive waiters: the lane's own queued runs, for snapshots.
        self.live = 0
        # Running holders. Exclusive ones are normally 0 or 1; more only after
        # agent exclusivity is switched on while an agent runs several times.
        self.x_holders = 0
        self.ix_holders = 0


class _Provider:
    """One provider: its slots, its counts, and its heap of ready runs.

    Everything the hot paths ask of a provider, in one object its runs
    point at, so a start or a finish reads attributes instead of looking
    the provider's name up in a dict per count.
    """

    __slots__ = ("cap", "name", "queued", "ready", "running")

    def __init__(self, name: str, cap: int) -> None:
        self.name = name
        self.cap = cap  # its slots under the limits in force
        self.queued = 0
        self.running = 0  # held runs are not
        # Runs free to start on their lanes, by submission sequence; cancelled
        # and no longer ready runs linger until they reach the top.
        self.ready: list[tuple[int, _Entry]] = []


def _front(queue: deque[_Entry]) -> _Entry | None:
    """The first live waiter of ``queue``, dropping tombstones before it."""
    while queue:
        head = queue[0]
        if head.state is _QUEUED:
            return head
        queue.popleft()
    return None


class _Entry:
    __slots__ = ("in_heap", "locks", "provider", "run", "seq", "state")

    def __init__(
        self,
        run: RunRequest,
        seq: int,
        locks: tuple[tuple[_Lane, bool], ...],
        provider: _Provider,
    ) -> None:
        self.run = run
        self.seq = seq
        self.locks = locks  # (lane, exclusive)
        self.provider = provider  # run.provider's slots and ready heap
        self.state: RunState | None = _QUEUED  # None once cancelled or finished
        self.in_heap = False

    def __lt__(self, other: _Entry) -> bool:
        # Heaps order (seq, entry): a tie is a cancelled run's tombstone and
        # the same run put back in its place (a refused cancel). Either may
        # pop first (the tombstone is dropped), so they compare equal rather
        # than by anything that could differ between processes.
        return False


def _insert_by_seq(queue: deque[_Entry], entry: _Entry) -> None:
    """Insert ``entry`` where its sequence number puts it (near the front, as a rule).

    A run that held a lane went ahead of every waiter there, so a requeued
    run normally goes first; after agent exclusivity was switched on, an
    earlier run may be waiting, so the position is searched, not assumed.
    """
    for index, other in enumerate(queue):
        if other.seq > entry.seq:
            queue.insert(index, entry)
            return
    queue.append(entry)


def _hold_back_intentions(lane: _Lane, seq: int) -> None:
    """Intention waiters behind ``seq`` wait on ``lane`` again: an exclusive run goes first.

    ``ix_pending`` stays a suffix of ``ix_queue``: the released waiters after
    ``seq`` rejoin it. One a ready heap holds is dropped there as stale, and
    offered again when the lane releases it.
    """
    pending = {id(entry) for entry in lane.ix_pending}
    lane.ix_pending = deque(
        entry
        for entry in lane.ix_queue
        if entry.state is RunState.QUEUED and (entry.seq > seq or id(entry) in pending)
    )


def _ready_on(lane: _Lane, entry: _Entry, exclusive: bool) -> bool:
    """Whether ``lane`` lets ``entry`` start (the other lanes aside)."""
    if lane.x_holders:
        return False
    if exclusive:
        if lane.ix_holders:
            return False
        queue = lane.x_queue
        # The common case first: the entry itself heads the queue.
        if not (queue and queue[0] is entry) and _front(queue) is not entry:
            return False
        if not lane.ix_queue:
            return True
        first_ix = _front(lane.ix_queue)
        return first_ix is None or first_ix.seq > entry.seq
    first_x = _front(lane.x_queue)
    return first_x is None or first_x.seq > entry.seq


def _is_ready(entry: _Entry) -> bool:
    """Whether every lane of ``entry`` lets it start (slots aside)."""
    # _ready_on inlined for exclusive locks, the hottest path by far (every
    # conversation and agent lane); a plain loop, as all() over a
    # generator costs about twice as much here.
    for lane, exclusive in entry.locks:
        if lane.x_holders:
            return False
        if exclusive:
            queue = lane.x_queue
            if lane.ix_holders or (
                not (queue and queue[0] is entry) and _front(queue) is not entry
            ):
                return False
            if lane.ix_queue:
                first_ix = _front(lane.ix_queue)
                if first_ix is not None and first_ix.seq < entry.seq:
                    return False
        elif not _ready_on(lane, entry, exclusive):
            return False
    return True


class Scheduler:
    """Decides which queued runs may start, honouring lanes and caps.

    Drive it with :meth:`submit`, :meth:`finish`, :meth:`cancel`,
    :meth:`requeue`, :meth:`hold` and :meth:`set_limits`; after any of them
    call :meth:`take_startable` to get the runs to start now (they are marked
    running by that call).
    """

    def __init__(self, limits: Limits | None = None, *, agent_exclusive: bool = True) -> None:
        self._limits = limits if limits is not None else Limits()
        self._agent_exclusive = agent_exclusive
        self._next_seq = 0
        # Insertion order is submission order: every entry is added by
        # ``submit`` with a larger sequence number than all before it, or
        # put in its place by ``_insert``.
        self._entries: dict[str, _Entry] = {}
        self._lanes: dict[str, _Lane] = {}
        # Every provider a run was ever submitted for, in that order.
        self._providers: dict[str, _Provider] = {}
        self._running = 0
        #: How many runs wait to start (read-only: kept by the events below).
        #: An attribute, not a property: the supervisor asks before every
        #: start and every finish, and a property is a Python call each time.
        self.queued_count = 0
        # Held runs in the order they were held; they hold lanes, not slots.
        self._held: dict[str, _Entry] = {}
        # Queued runs on no lane at all (no key), so a snapshot lists them
        # without a walk of every queued run.
        self._lone: dict[str, _Entry] = {}
        #: The ready index (read-only), by provider name: each provider whose
        #: ready heap's top may start (its lanes allow it) and whose running
        #: runs are below its cap. The global cap aside. A provider absent
        #: here can start nothing until an event (a finish, a cancel, a
        #: higher cap) puts it back. An attribute, not a method: every
        #: dispatch reads it. Only :meth:`_index` changes it.
        self.startable: dict[str, _Provider] = {}

    # -- queries -----------------------------------------------------------

    @property
    def limits(self) -> Limits:
        """The limits in force."""
        return self._limits

    @property
    def agent_exclusive(self) -> bool:
        """Whether runs of one agent in one workspace exclude each other."""
        return self._agent_exclusive

    @property
    def running_count(self) -> int:
        """How many runs are running (held runs are not)."""
        return self._running

    @property
    def held_count(self) -> int:
        """How many runs are held (:meth:`hold`)."""
        return len(self._held)

    def state_of(self, run_id: str) -> RunState | None:
        """The run's state, or ``None`` if it is not queued or running."""
        entry = self._entries.get(run_id)
        return None if entry is None else entry.state

    def request_of(self, run_id: str) -> RunRequest | None:
        """The run as submitted, while it is queued or running."""
        entry = self._entries.get(run_id)
        return None if entry is None else entry.run

    def seq_of(self, run_id: str) -> int | None:
        """The run's submission sequence number, while it is queued or running."""
        entry = self._entries.get(run_id)
        return None if entry is None else entry.seq

    def queued_for(self, provider: str) -> int:
        """Queued runs of ``provider``. O(1)."""
        known = self._providers.get(provider)
        return 0 if known is None else known.queued

    def running_for(self, provider: str) -> int:
        """Running runs of ``provider``. O(1)."""
        known = self._providers.get(provider)
        return 0 if known is None else known.running

    def has_free_slot(self, provider: str) -> bool:
        """Whether ``provider`` and the global cap both have a slot free now. O(1).

        Lanes and account gates aside: a run of ``provider`` can start only
        if this holds, so a caller may skip :meth:`take_startable` when it
        does not and nothing else changed.
        """
        cap = self._limits.global_cap
        return self.running_for(provider) < self._limits.provider_caps.get(provider, 0) and (
            cap is None or self._running < cap
        )

    def is_busy(self, run: RunRequest) -> bool:
        """Whether a queued or running run already shares one of ``run``'s keys.

        This is the ``on_busy: "skip"`` guard against duplicate follow-ups.
        """
        for key in busy_keys(run, agent_exclusive=self._agent_exclusive):
            lane = self._lanes.get(key)
            if lane is not None and (lane.live or lane.x_holders):
                return True
        return False

    def running_runs(self) -> Iterator[RunRequest]:
        """Running runs, in submission order."""
        return (e.run for e in self._entries.values() if e.state is RunState.RUNNING)

    def held_runs(self) -> Iterator[RunRequest]:
        """Held runs, in the order they were held."""
        return (e.run for e in self._held.values())

    def queued_runs(self) -> Iterator[RunRequest]:
        """Queued runs, in submission order."""
        return (e.run for e in self._entries.values() if e.state is RunState.QUEUED)

    def snapshot(self) -> SchedulerSnapshot:
        """Counts per provider and per lane. O(lanes + queued lone runs + held runs).

        Never a walk of the queue: runs on lanes are counted by their lanes,
        and lone runs are kept apart as they come and go.
        """
        by_lane = {k: lane.live for k, lane in self._lanes.items() if lane.live}
        for entry in self._lone.values():
            by_lane[f"run:{entry.run.workspace}/{entry.run.id}"] = 1
        held_by_provider: dict[str, int] = {}
        for entry in self._held.values():
            provider = entry.run.provider
            held_by_provider[provider] = held_by_provider.get(provider, 0) + 1
        providers = sorted(self._providers.items())
        return SchedulerSnapshot(
            queued=self.queued_count,
            running=self._running,
            queued_by_provider={name: known.queued for name, known in providers if known.queued},
            running_by_provider={name: known.running for name, known in providers if known.running},
            queued_by_lane=dict(sorted(by_lane.items())),
            held=len(self._held),
            held_by_provider=dict(sorted(held_by_provider.items())),
        )

    # -- events ------------------------------------------------------------

    def submit(self, run: RunRequest, *, seq: int | None = None) -> None:
        """Queue a run behind everything submitted before it.

        With ``seq``, the run's place is that submission sequence number
        instead of the next one (a fleet member passes the ledger's ``seq``):
        a number below one already given places the run as :meth:`requeue`
        places a run, before every run with a higher number. Numbers must be
        unique: give every run one, or none. Raises :class:`SchedulerError`
        if a queued or running run already has this id (idempotent
        submission is the store's job, not the core's).
        """
        if run.id in self._entries:
            raise SchedulerError(f"run {run.id!r} is already queued or running")
        if seq is not None and seq < self._next_seq:
            self._insert(run, seq)
            return
        if seq is not None:
            self._next_seq = seq
        if (
            run.conversation is None
            and run.cwd is None
            and (run.agent is None or not self._agent_exclusive)
        ):
            locks: tuple[tuple[_Lane, bool], ...] = ()  # a lane of its own: no key at all
        else:
            locks = self._locks_for(run)
        provider = self._providers.get(run.provider) or self._provider(run.provider)
        entry = _Entry(run, self._next_seq, locks, provider)
        self._next_seq += 1
        self._entries[run.id] = entry
        if not locks:
            self._lone[run.id] = entry
        ready = True
        for lane, exclusive in locks:
            self._enqueue(lane, entry, exclusive)
            if ready and not _ready_on(lane, entry, exclusive):
                ready = False
        provider.queued += 1
        self.queued_count += 1
        if ready:
            # _push_ready inlined: every submit of a run on a free lane comes here.
            heapq.heappush(provider.ready, (entry.seq, entry))
            entry.in_heap = True
            if provider.name not in self.startable:
                self._index(provider)

    def take_startable(self, gate: StartGate | None = None) -> list[RunRequest]:
        """Mark as running, and return in start order, every run that may start now.

        With a ``gate``, a provider's runs start only while the gate is open
        for that provider; the gate is told of every start. Only providers
        in the ready index (:attr:`startable`) are looked at, and only
        their gates asked.
        """
        startable = self.startable
        if not startable:
            return []
        started: list[RunRequest] = []
        global_cap = self._limits.global_cap
        # An indexed heap's top may start as far as its lanes and its
        # provider's slots go: only the gate is left to ask. (A plain loop: a
        # comprehension is a call of its own.)
        candidates: list[_Provider] = []
        for provider in startable.values():
            if gate is None or gate.can_start(provider.name):
                candidates.append(provider)
        while candidates and (global_cap is None or self._running < global_cap):
            best = candidates[0]
            if len(candidates) > 1:
                for candidate in candidates:
                    if candidate.ready[0][0] < best.ready[0][0]:
                        best = candidate
            entry = heapq.heappop(best.ready)[1]
            entry.in_heap = False
            # Start it: a tombstone in every queue from now on.
            entry.state = _RUNNING
            if not entry.locks:
                del self._lone[entry.run.id]
            for lane, exclusive in entry.locks:
                if exclusive:
                    # _index checked that ``entry`` heads this lane.
                    lane.x_queue.popleft()
                    lane.live -= 1
                    lane.x_holders += 1
                else:
                    lane.ix_holders += 1
            best.queued -= 1
            best.running += 1
            self.queued_count -= 1
            self._running += 1
            run = entry.run
            started.append(run)
            if gate is not None:
                gate.started(run)
            # Only this heap's top can have gone stale: no other ready run
            # conflicts with the run just started on any lane (one of the two
            # would be waiting behind the other), so their readiness holds.
            if not self._index(best):
                candidates.remove(best)  # nothing ready, or no slot: out of the index
            elif gate is not None and not gate.can_start(best.name):
                candidates.remove(best)  # still indexed: its gate may open by itself
        return started

    def finish(self, run_id: str) -> None:
        """A running run ended (any outcome): free its slot and its lanes."""
        entry = self._entries.get(run_id)
        if entry is None or entry.state is not _RUNNING:
            raise SchedulerError(f"run {run_id!r} is not running")
        del self._entries[run_id]
        entry.state = None
        self._running -= 1
        provider = entry.provider
        provider.running -= 1
        if provider.ready and provider.name not in self.startable:
            self._index(provider)  # its slot is free: its ready runs may start
        for lane, exclusive in entry.locks:
            if exclusive:
                lane.x_holders -= 1
            else:
                lane.ix_holders -= 1
            self._lane_changed(lane)

    def hold(self, run_id: str) -> None:
        """Hold a running run back without a process: it keeps its lanes, not its slot.

        For a run started here whose start was refused elsewhere for now (a
        fleet member's claim, docs/fleet.md): runs behind it on its lanes
        still wait for it, and it is not offered again, but it no longer
        counts against its provider's cap or the global cap, so another run
        may take the slot at once. :meth:`requeue` puts it back in its place
        in the queue; :meth:`cancel` withdraws it. O(1).
        """
        entry = self._entries.get(run_id)
        if entry is None or entry.state is not RunState.RUNNING:
            raise SchedulerError(f"run {run_id!r} is not running")
        entry.state = RunState.HELD
        self._running -= 1
        entry.provider.running -= 1
        self._held[run_id] = entry
        self._index(entry.provider)

    def requeue(self, run_id: str) -> None:
        """Put a running or held run back in the queue, in its original place.

        For a run that never got to work (its account was out of quota, its
        start was refused elsewhere): it keeps its submission sequence, so it
        heads its lanes again and goes before every run submitted after it.
        O(length of its lanes) — a rare event, never a scheduling decision.
        """
        entry = self._entries.get(run_id)
        if entry is None:
            raise SchedulerError(f"run {run_id!r} is not running")
        provider = entry.provider
        if entry.state is RunState.RUNNING:
            self._running -= 1
            provider.running -= 1
        elif entry.state is RunState.HELD:
            del self._held[run_id]
        else:
            raise SchedulerError(f"run {run_id!r} is not running")
        entry.state = RunState.QUEUED
        provider.queued += 1
        self.queued_count += 1
        if not entry.locks:
            self._lone[run_id] = entry
        for lane, exclusive in entry.locks:
            if exclusive:
                lane.x_holders -= 1
                lane.live += 1
                _insert_by_seq(lane.x_queue, entry)
            else:
                lane.ix_holders -= 1
                # Started intention waiters linger as tombstones until they
                # reach the front; this one may come back to life in place.
                if entry not in lane.ix_queue:
                    _insert_by_seq(lane.ix_queue, entry)
                if not _ready_on(lane, entry, False) and entry not in lane.ix_pending:
                    _insert_by_seq(lane.ix_pending, entry)
        for lane, _ in entry.locks:
            self._lane_changed(lane)
        self._offer(entry)
        # Back at the head of its lanes, it may stand before a ready run there.
        self._reindex()
        self._index(provider)

    def _insert(self, run: RunRequest, seq: int) -> None:
        """Queue a run in its place by ``seq``, before runs submitted after it.

        Made a holder of its lanes, then put back as :meth:`requeue` puts a
        run back: the same placement, the same offers. Intention waiters
        after it that its lanes had released already wait for it again.
        O(length of its lanes) — a rare event, never a scheduling decision.
        """
        locks = self._locks_for(run)
        provider = self._providers.get(run.provider) or self._provider(run.provider)
        entry = _Entry(run, seq, locks, provider)
        entry.state = RunState.RUNNING
        entries = list(self._entries.items())
        place = next((i for i, (_, e) in enumerate(entries) if e.seq > seq), len(entries))
        entries.insert(place, (run.id, entry))
        self._entries = dict(entries)
        for lane, exclusive in locks:
            if exclusive:
                lane.x_holders += 1
                if lane.ix_queue:
                    _hold_back_intentions(lane, seq)
            else:
                lane.ix_holders += 1
        self._running += 1
        provider.running += 1
        self.requeue(run.id)

    def cancel(self, run_id: str) -> CancelOutcome:
        """Withdraw a queued or held run. A running run is only reported, not stopped."""
        entry = self._entries.get(run_id)
        if entry is None:
            return CancelOutcome.UNKNOWN
        if entry.state is RunState.RUNNING:
            return CancelOutcome.RUNNING
        if entry.state is RunState.HELD:
            # Withdrawn as a running run ends, freeing its lanes: running
            # again for that instant only to give back the slot hold took.
            del self._held[run_id]
            entry.state = RunState.RUNNING
            self._running += 1
            entry.provider.running += 1
            self.finish(run_id)
            return CancelOutcome.REMOVED
        del self._entries[run_id]
        entry.state = None
        entry.provider.queued -= 1
        self.queued_count -= 1
        if not entry.locks:
            del self._lone[run_id]
        for lane, exclusive in entry.locks:
            if exclusive:
                lane.live -= 1
            self._lane_changed(lane)
        if entry.in_heap:
            self._reindex()  # it may have been an indexed heap's top
        return CancelOutcome.REMOVED

    def set_limits(self, limits: Limits) -> None:
        """Replace the caps. Running runs are never stopped by a lower cap."""
        self._limits = limits
        caps = limits.provider_caps
        for provider in self._providers.values():
            provider.cap = caps.get(provider.name, 0)
            self._index(provider)

    def set_agent_exclusive(self, agent_exclusive: bool) -> None:
        """Switch agent exclusivity, re-deriving every run's lanes.

        O(n) in queued and running runs: a configuration reload, not a
        scheduling decision. Running runs keep running; when exclusivity is
        switched on, an agent's queued runs wait until all of its running
        runs have finished.
        """
        if agent_exclusive == self._agent_exclusive:
            return
        self._agent_exclusive = agent_exclusive
        self._lanes = {}
        for provider in self._providers.values():
            provider.ready = []
        self.startable.clear()
        self._lone = {}
        # Holders first (running and held runs): a run placed by seq
        # (``_insert``) may be queued before a running run it conflicts
        # with, and must find it holding.
        for entry in self._entries.values():
            entry.locks = self._locks_for(entry.run)
            entry.in_heap = False
            if entry.state is not RunState.QUEUED:
                for lane, exclusive in entry.locks:
                    if exclusive:
                        lane.x_holders += 1
                    else:
                        lane.ix_holders += 1
        for entry in self._entries.values():  # submission order
            if entry.state is RunState.QUEUED:
                if not entry.locks:
                    self._lone[entry.run.id] = entry
                for lane, exclusive in entry.locks:
                    self._enqueue(lane, entry, exclusive)
        for lane in list(self._lanes.values()):
            self._release_intentions(lane)
        for entry in self._entries.values():
            if entry.state is RunState.QUEUED:
                self._offer(entry)

    # -- internals ---------------------------------------------------------

    def _locks_for(self, run: RunRequest) -> tuple[tuple[_Lane, bool], ...]:
        lanes = self._lanes
        locks = []
        for key in exclusion_keys(run, agent_exclusive=self._agent_exclusive):
            lane = lanes.get(key)
            if lane is None:
                lane = lanes[key] = _Lane(key)
            locks.append((lane, True))
        if run.cwd is not None:
            for key in intention_keys(run):
                lane = lanes.get(key)
                if lane is None:
                    lane = lanes[key] = _Lane(key)
                locks.append((lane, False))
        return tuple(locks)

    @staticmethod
    def _enqueue(lane: _Lane, entry: _Entry, exclusive: bool) -> None:
        if exclusive:
            lane.x_queue.append(entry)
            lane.live += 1
        else:
            lane.ix_queue.append(entry)
            if _ready_on(lane, entry, False) and not lane.ix_pending:
                return  # free on this lane from the start: nothing to release later
            lane.ix_pending.append(entry)

    def _offer(self, entry: _Entry) -> None:
        """Put a queued run in its provider's ready heap if it may start."""
        if not entry.in_heap and _is_ready(entry):
            self._push_ready(entry)

    def _push_ready(self, entry: _Entry) -> None:
        """Add a run known to be ready to its provider's heap, and index the provider."""
        provider = entry.provider
        heapq.heappush(provider.ready, (entry.seq, entry))
        entry.in_heap = True
        if provider.name not in self.startable:
            self._index(provider)

    def _index(self, provider: _Provider) -> bool:
        """Put ``provider`` in the ready index, or take it out, as its heap and slots now say.

        Its heap's cancelled or no longer ready tops are dropped first, so an
        indexed heap's top is always a run that may start (lanes and slots).
        The one place that decides both; returns whether it is indexed.
        """
        if provider.running < provider.cap:
            heap = provider.ready
            while heap:
                top = heap[0][1]
                if top.state is _QUEUED and (not top.locks or _is_ready(top)):
                    self.startable[provider.name] = provider
                    return True
                heapq.heappop(heap)
                top.in_heap = False
        self.startable.pop(provider.name, None)
        return False

    def _reindex(self) -> None:
        """After an event that may leave a ready run behind an earlier one (a re-queue, a
        cancel): index every indexed provider again, dropping stale tops. O(P)."""
        for provider in list(self.startable.values()):
            self._index(provider)

    def _provider(self, name: str) -> _Provider:
        """The slots and ready heap of a provider seen for the first time."""
        provider = self._providers[name] = _Provider(name, self._limits.provider_caps.get(name, 0))
        return provider

    def _lane_changed(self, lane: _Lane) -> None:
        """A holder left or a waiter was withdrawn: offer whoever it may have freed."""
        if lane.x_holders:
            return
        if lane.ix_pending:
            self._release_intentions(lane)
        first_x = _front(lane.x_queue)
        if lane.ix_holders:
            return
        first_ix = _front(lane.ix_queue) if lane.ix_queue else None
        if first_x is not None:
            if first_ix is None or first_ix.seq > first_x.seq:
                self._offer(first_x)
        elif first_ix is None and self._lanes.get(lane.key) is lane:
            del self._lanes[lane.key]  # nothing holds or waits: drop it

    def _release_intentions(self, lane: _Lane) -> None:
        """Offer the intention waiters no earlier exclusive request blocks any more.

        Each is released once: nothing later can block it on this lane again.
        """
        if lane.x_holders:
            return
        first_x = _front(lane.x_queue)
        boundary = first_x.seq if first_x is not None else None
        pending = lane.ix_pending
        while pending:
            entry = pending[0]
            if entry.state is not RunState.QUEUED:
                pending.popleft()
                continue
            if boundary is not None and entry.seq > boundary:
                return
            pending.popleft()
            self._offer(entry)
