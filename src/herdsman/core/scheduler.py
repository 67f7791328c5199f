"""The sans-IO scheduling core: which queued run may start now.

The contract (see docs/scheduling.md) in one paragraph: a run may start when
its provider and the global cap have a free slot, no running run shares one of
its exclusion keys, and no earlier-submitted queued run shares one of its keys.
Among runs free to start the earliest submitted goes first, and a busy lane
never holds up runs on other lanes.

How it stays cheap. Every key (a *lane*) keeps a FIFO of its queued runs and a
count of running runs holding it. A run is *ready* when it heads every lane it
is on and none of those lanes is held; a run is on at most two lanes, so that
test is O(1). Ready runs wait in one heap per provider ordered by submission
sequence. Readiness can only change for the new head of a lane whose front
moved (a start, a finish, a cancel), so each event touches O(1) lanes and does
O(log n) heap work. Cancelled runs are left in place as tombstones and dropped
when they reach a lane's front or a heap's top (amortised O(1)). Picking the
next start compares the heads of the provider heaps that have a free slot:
O(P) in the number of configured providers, which is small and fixed by the
config, never by the queue.

No I/O, no clock, no randomness, and no iteration over hash-ordered sets: the
same calls produce the same decisions in any process.
"""

from __future__ import annotations

import enum
import heapq
from collections import deque
from collections.abc import Iterator, Mapping

import attrs

from herdsman.core.runs import RunRequest, exclusion_keys


class RunState(enum.Enum):
    """Where a run the scheduler knows about stands."""

    QUEUED = "queued"
    RUNNING = "running"


class CancelOutcome(enum.Enum):
    """What :meth:`Scheduler.cancel` did."""

    #: The run was queued and is gone; it will never start.
    REMOVED = "removed"
    #: The run is executing: the caller must stop it, then call ``finish``.
    RUNNING = "running"
    #: No queued or running run has this id.
    UNKNOWN = "unknown"


class SchedulerError(Exception):
    """A call that breaks the core's protocol (a bug in the caller)."""


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
    conversation or agent key appear as ``run:<workspace>/<id>``.
    """

    queued: int
    running: int
    queued_by_provider: Mapping[str, int]
    running_by_provider: Mapping[str, int]
    queued_by_lane: Mapping[str, int]


class _Lane:
    """One exclusion key: its queued runs in submission order, and its holders."""

    __slots__ = ("holders", "key", "live", "queue")

    def __init__(self, key: str) -> None:
        self.key = key
        # May contain cancelled tombstones anywhere; ``live`` counts the rest.
        self.queue: deque[_Entry] = deque()
        self.live = 0
        # Running runs that hold this key. Normally 0 or 1; it can exceed 1
        # only after agent exclusivity is switched on while several runs of
        # one agent are already running.
        self.holders = 0


class _Entry:
    __slots__ = ("in_heap", "lanes", "run", "seq", "state")

    def __init__(self, run: RunRequest, seq: int, lanes: tuple[_Lane, ...]) -> None:
        self.run = run
        self.seq = seq
        self.lanes = lanes
        self.state: RunState | None = RunState.QUEUED  # None once cancelled
        self.in_heap = False


class Scheduler:
    """Decides which queued runs may start, honouring lanes and caps.

    Drive it with :meth:`submit`, :meth:`finish`, :meth:`cancel` and
    :meth:`set_limits`; after any of them call :meth:`take_startable` to get
    the runs to start now (they are marked running by that call).
    """

    def __init__(self, limits: Limits | None = None, *, agent_exclusive: bool = True) -> None:
        self._limits = limits if limits is not None else Limits()
        self._agent_exclusive = agent_exclusive
        self._next_seq = 0
        # Insertion order is submission order: every entry is added by
        # ``submit`` with a larger sequence number than all before it.
        self._entries: dict[str, _Entry] = {}
        self._lanes: dict[str, _Lane] = {}
        self._ready: dict[str, list[tuple[int, _Entry]]] = {}
        self._queued_by_provider: dict[str, int] = {}
        self._running_by_provider: dict[str, int] = {}
        self._running = 0

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
    def queued_count(self) -> int:
        """How many runs wait to start."""
        return len(self._entries) - self._running

    @property
    def running_count(self) -> int:
        """How many runs are running."""
        return self._running

    def state_of(self, run_id: str) -> RunState | None:
        """The run's state, or ``None`` if it is not queued or running."""
        entry = self._entries.get(run_id)
        return None if entry is None else entry.state

    def request_of(self, run_id: str) -> RunRequest | None:
        """The run as submitted, while it is queued or running."""
        entry = self._entries.get(run_id)
        return None if entry is None else entry.run

    def queued_for(self, provider: str) -> int:
        """Queued runs of ``provider``. O(1)."""
        return self._queued_by_provider.get(provider, 0)

    def running_for(self, provider: str) -> int:
        """Running runs of ``provider``. O(1)."""
        return self._running_by_provider.get(provider, 0)

    def is_busy(self, run: RunRequest) -> bool:
        """Whether a queued or running run already shares one of ``run``'s keys.

        This is the ``on_busy: "skip"`` guard against duplicate follow-ups.
        """
        for key in exclusion_keys(run, agent_exclusive=self._agent_exclusive):
            lane = self._lanes.get(key)
            if lane is not None and (lane.live or lane.holders):
                return True
        return False

    def running_runs(self) -> Iterator[RunRequest]:
        """Running runs, in submission order."""
        return (e.run for e in self._entries.values() if e.state is RunState.RUNNING)

    def queued_runs(self) -> Iterator[RunRequest]:
        """Queued runs, in submission order."""
        return (e.run for e in self._entries.values() if e.state is RunState.QUEUED)

    def snapshot(self) -> SchedulerSnapshot:
        """Counts per provider and per lane. O(lanes + queued lone runs)."""
        by_lane = {k: lane.live for k, lane in self._lanes.items() if lane.live}
        for entry in self._entries.values():
            if entry.state is RunState.QUEUED and not entry.lanes:
                by_lane[f"run:{entry.run.workspace}/{entry.run.id}"] = 1
        return SchedulerSnapshot(
            queued=self.queued_count,
            running=self._running,
            queued_by_provider={p: n for p, n in self._queued_by_provider.items() if n},
            running_by_provider={p: n for p, n in self._running_by_provider.items() if n},
            queued_by_lane=dict(sorted(by_lane.items())),
        )

    # -- events ------------------------------------------------------------

    def submit(self, run: RunRequest) -> None:
        """Queue a run behind everything submitted before it.

        Raises :class:`SchedulerError` if a queued or running run already has
        this id (idempotent submission is the store's job, not the core's).
        """
        if run.id in self._entries:
            raise SchedulerError(f"run {run.id!r} is already queued or running")
        lanes = self._lanes_for(run)
        entry = _Entry(run, self._next_seq, lanes)
        self._next_seq += 1
        self._entries[run.id] = entry
        ready = True
        for lane in lanes:
            lane.queue.append(entry)
            lane.live += 1
            # Ready only if it is the lane's sole live run and the lane is free.
            if lane.live != 1 or lane.holders:
                ready = False
        provider = run.provider
        self._queued_by_provider[provider] = self._queued_by_provider.get(provider, 0) + 1
        if ready:
            self._push_ready(entry)

    def take_startable(self) -> list[RunRequest]:
        """Mark as running, and return in start order, every run that may start now."""
        started: list[RunRequest] = []
        caps = self._limits.provider_caps
        global_cap = self._limits.global_cap
        running_by_provider = self._running_by_provider
        candidates: list[tuple[str, list[tuple[int, _Entry]]]] = []
        for provider, heap in self._ready.items():
            if heap and running_by_provider.get(provider, 0) < caps.get(provider, 0):
                self._drop_stale(heap)
                if heap:
                    candidates.append((provider, heap))
        while candidates and (global_cap is None or self._running < global_cap):
            best = candidates[0]
            for candidate in candidates:
                if candidate[1][0][0] < best[1][0][0]:
                    best = candidate
            provider, heap = best
            _, entry = heapq.heappop(heap)
            entry.in_heap = False
            self._start(entry)
            started.append(entry.run)
            # Only this heap's top can have gone stale: no other ready run
            # shares a lane with the run just started (both would have to
            # head that lane), so their readiness is unchanged.
            self._drop_stale(heap)
            if not heap or running_by_provider[provider] >= caps.get(provider, 0):
                candidates.remove(best)
        return started

    def finish(self, run_id: str) -> None:
        """A running run ended (any outcome): free its slot and its lanes."""
        entry = self._entries.get(run_id)
        if entry is None or entry.state is not RunState.RUNNING:
            raise SchedulerError(f"run {run_id!r} is not running")
        del self._entries[run_id]
        entry.state = None
        self._running -= 1
        self._running_by_provider[entry.run.provider] -= 1
        for lane in entry.lanes:
            lane.holders -= 1
            if lane.holders == 0:
                self._lane_front_moved(lane)

    def cancel(self, run_id: str) -> CancelOutcome:
        """Withdraw a queued run. A running run is only reported, not stopped."""
        entry = self._entries.get(run_id)
        if entry is None:
            return CancelOutcome.UNKNOWN
        if entry.state is RunState.RUNNING:
            return CancelOutcome.RUNNING
        del self._entries[run_id]
        entry.state = None
        self._queued_by_provider[entry.run.provider] -= 1
        for lane in entry.lanes:
            lane.live -= 1
            if lane.holders == 0:
                # The entry may have been the live front even with tombstones
                # before it, so always let the lane re-derive its head.
                self._lane_front_moved(lane)
        return CancelOutcome.REMOVED

    def set_limits(self, limits: Limits) -> None:
        """Replace the caps. Running runs are never stopped by a lower cap."""
        self._limits = limits

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
        self._ready = {}
        for entry in self._entries.values():  # submission order
            entry.lanes = self._lanes_for(entry.run)
            entry.in_heap = False
            for lane in entry.lanes:
                if entry.state is RunState.RUNNING:
                    lane.holders += 1
                else:
                    lane.queue.append(entry)
                    lane.live += 1
        for entry in self._entries.values():
            if entry.state is RunState.QUEUED:
                self._offer(entry)

    # -- internals ---------------------------------------------------------

    def _lanes_for(self, run: RunRequest) -> tuple[_Lane, ...]:
        keys = exclusion_keys(run, agent_exclusive=self._agent_exclusive)
        lanes = self._lanes
        result = []
        for key in keys:
            lane = lanes.get(key)
            if lane is None:
                lane = lanes[key] = _Lane(key)
            result.append(lane)
        return tuple(result)

    def _is_ready(self, entry: _Entry) -> bool:
        # A plain loop: this is the hottest path, and all() over a generator
        # costs about twice as much here.
        for lane in entry.lanes:
            if lane.holders or self._front(lane) is not entry:
                return False
        return True

    def _offer(self, entry: _Entry) -> None:
        """Put a queued run in its provider's ready heap if it may start."""
        if not entry.in_heap and self._is_ready(entry):
            self._push_ready(entry)

    def _push_ready(self, entry: _Entry) -> None:
        """Add a run known to be ready to its provider's heap."""
        heap = self._ready.get(entry.run.provider)
        if heap is None:
            heap = self._ready[entry.run.provider] = []
        heapq.heappush(heap, (entry.seq, entry))
        entry.in_heap = True

    def _drop_stale(self, heap: list[tuple[int, _Entry]]) -> None:
        """Pop heap tops that were cancelled or are no longer ready."""
        while heap:
            entry = heap[0][1]
            if entry.state is RunState.QUEUED and self._is_ready(entry):
                return
            heapq.heappop(heap)
            entry.in_heap = False

    @staticmethod
    def _front(lane: _Lane) -> _Entry | None:
        """The lane's first live queued run, dropping tombstones before it."""
        queue = lane.queue
        while queue:
            head = queue[0]
            if head.state is not None:
                return head
            queue.popleft()
        return None

    def _lane_front_moved(self, lane: _Lane) -> None:
        """An unheld lane's front may have changed: offer its new head, or drop it."""
        head = self._front(lane)
        if head is not None:
            self._offer(head)
        elif self._lanes.get(lane.key) is lane:
            del self._lanes[lane.key]

    def _start(self, entry: _Entry) -> None:
        for lane in entry.lanes:
            # _drop_stale just checked that ``entry`` heads this lane.
            lane.queue.popleft()
            lane.live -= 1
            lane.holders += 1
        entry.state = RunState.RUNNING
        provider = entry.run.provider
        self._queued_by_provider[provider] -= 1
        self._running_by_provider[provider] = self._running_by_provider.get(provider, 0) + 1
        self._running += 1
