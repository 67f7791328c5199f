"""What the supervisor's services share: the runs here and the supervisor's own state.

The :class:`Supervisor` facade makes one :class:`Shared` and hands it to each
service (intake, dispatch, execution, the fleet member's glue); it is the
only owner, and replaces the configuration in force (``config``,
``worktrees``) at a reload. The per-run state is written by the service the
comment beside it names, and read by the others.

A :class:`Service` keeps the parts never replaced (the lifecycle, the
ledger, the per-run dicts) under its own names, so its code reads as it did
in one class and a run's path pays no extra lookup for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from herdsman.config import Config
from herdsman.core import KeyClaims
from herdsman.core.accounts import Pick
from herdsman.core.lifecycle import Lifecycle
from herdsman.runtime.changes import Changes
from herdsman.runtime.fleet_member import FleetMember
from herdsman.runtime.ledger import Ledger
from herdsman.runtime.metrics import Metrics
from herdsman.runtime.runner import RunCancel
from herdsman.runtime.stop_order import StopOrder
from herdsman.runtime.store import StoreError
from herdsman.runtime.worktrees.manager import WorktreeManager
from herdsman.trace import TraceWriter

__all__ = ["Service", "Shared"]

log = logging.getLogger("herdsman.supervisor")


class Shared:
    """The state the supervisor's services share; the facade owns it.

    Fixed for the supervisor's life: ``life``, ``ledger``, ``wall``,
    ``trace``, ``metrics``, ``fleet``, ``changes``. Replaced at a reload:
    ``config``, ``worktrees``.
    """

    #: Once a forced stop cancelled the running runs: the order they record in.
    stop_order: StopOrder | None = None

    def __init__(
        self,
        config: Config,
        *,
        life: Lifecycle,
        ledger: Ledger,
        wall: Callable[[], float],
        trace: TraceWriter | None,
        metrics: Metrics,
        fleet: FleetMember | None,
        worktrees: WorktreeManager | None,
    ) -> None:
        self.config = config
        self.worktrees = worktrees
        self.life = life
        self.ledger = ledger
        self.wall = wall
        self.trace = trace
        self.metrics = metrics
        # Run counts that count nothing (the replay's) are not even called.
        self.counts_runs = metrics.counts_runs
        self.fleet = fleet
        #: Touched whenever what the dashboard shows may have changed.
        self.changes = Changes()
        # A running run's cancel, from its start being queued (dispatch) until
        # its task lets it go (execution).
        self.handles: dict[str, RunCancel] = {}
        # The account each starting run was given, and the configuration its
        # start was decided under, until its task has read them (dispatch).
        self.picks: dict[str, tuple[Pick, Config]] = {}
        # When each queued run was submitted (intake, the fleet's poll), for
        # the status's oldest wait and the start's metrics.
        self.submitted_at: dict[str, float] = {}
        # Long polls waiting for a run's end (intake), woken by notify.
        self.waiters: dict[str, list[trio.Event]] = {}
        # Runs whose checkouts are being prepared (nothing spawned yet).
        self.preparing: dict[str, trio.CancelScope] = {}
        # Fleet members' finishes the ledger refused, being recorded again.
        self.finish_retries: dict[str, trio.CancelScope] = {}
        # Keys of submits queued in the ledger but not yet in the scheduler,
        # so on_busy="skip" sees a follow-up that arrived a moment earlier.
        self.pending_keys = KeyClaims()
        self.wakeup = trio.Event()  # the dispatcher's: something may start
        self.idle = trio.Event()  # set when the last running run is let go
        self.ready = trio.Event()  # recovery done: intake may proceed
        self.stopping = False  # long polls answer at once from now on
        self.fatal: str | None = None
        # The run tasks' nursery and the completion callbacks', while serving.
        self.nursery: trio.Nursery | None = None
        self.callbacks: trio.Nursery | None = None

    @property
    def trace_prompts(self) -> bool:
        """Whether the trace records the runs' prompts."""
        return self.config.trace.record_prompts

    def poll_interval(self) -> float:
        """Seconds between a fleet member's polls of the ledger."""
        return self.config.fleet.poll.total_seconds()

    def wake(self) -> None:
        """Wake the dispatcher: a run may start."""
        self.wakeup.set()
        self.changes.touch()

    def emit(self, kind: str, **fields: Any) -> None:
        """Trace an event, if there is a trace."""
        if self.trace is not None:
            self.trace.record(kind, fields)

    async def emit_in_ledger_order(self, kind: str, **fields: Any) -> None:
        """Trace an event after every change already on its way to the ledger.

        For events that change what may start (a reload, a shutdown): starts
        are traced when their commit lands, so one decided before the event
        must be traced before it too.
        """
        if self.trace is None:
            return
        try:
            await self.ledger.call(lambda _: None, then=lambda _: self.emit(kind, **fields))
        except StoreError as error:
            log.error("%s not traced: the run ledger failed: %s", kind, error)

    def notify(self, run_id: str) -> None:
        """Wake whoever waits on the run's end."""
        self.changes.touch()
        for event in self.waiters.pop(run_id, ()):
            event.set()

    def stop(self, run_id: str, reason: str) -> None:
        """Stop a running run: its process group, or its preparation if not spawned yet."""
        # Running in the lifecycle (a run has a handle from its start until its
        # task lets it go), or ended already there (its finish on its way).
        self.life.cancel(run_id)
        self.handles[run_id].cancel(reason)
        preparing = self.preparing.get(run_id)
        if preparing is not None:
            preparing.cancel()


class Service:
    """A service of the supervisor: its view of :class:`Shared`.

    The parts never replaced are kept under the names the code has always
    used; what a reload replaces, or an event, is read from ``_shared``.
    """

    def __init__(self, shared: Shared) -> None:
        self._shared = shared
        self._life = shared.life
        self.ledger = shared.ledger
        self._wall = shared.wall
        self._trace = shared.trace
        self.metrics = shared.metrics
        self._counts_runs = shared.counts_runs
        self._fleet = shared.fleet
        self.changes = shared.changes
        self._handles = shared.handles
        self._picks = shared.picks
        self._submitted_at = shared.submitted_at
        self._waiters = shared.waiters
        self._preparing = shared.preparing
        self._finish_retries = shared.finish_retries
        self._pending_keys = shared.pending_keys
        self._emit = shared.emit
        self._wake = shared.wake
        self._notify = shared.notify
