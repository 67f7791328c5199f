"""Maintenance: pruning finished runs from the ledger and sweeping idle worktrees, on timers.

:class:`Maintenance` owns the two loops and the sweep itself. It reads the
settings afresh at every turn (a reload changes the next one) and asks
the supervisor only whether a conversation is busy.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from operator import methodcaller

import trio

from herdsman.config import Config
from herdsman.runtime.fleet_member import FleetMember
from herdsman.runtime.ledger import Ledger
from herdsman.runtime.store import StoreError
from herdsman.runtime.worktrees.manager import WorktreeManager
from herdsman.runtime.worktrees.sweeper import IsBusy, SweepReport, idle_folders, sweep

__all__ = ["Maintenance"]

log = logging.getLogger("herdsman.supervisor")


class Maintenance:
    """The prune and sweep loops, and a sweep on demand.

    ``config`` and ``worktrees`` are read at each turn (a reload swaps
    them); ``is_busy`` says whether a conversation has a run queued,
    running or being submitted here; ``sleep_until`` sleeps until a trio
    time, or until a reload.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        config: Callable[[], Config],
        worktrees: Callable[[], WorktreeManager | None],
        wall: Callable[[], float],
        is_busy: IsBusy,
        fleet: FleetMember | None,
        sleep_until: Callable[[float], Awaitable[None]],
    ) -> None:
        self._ledger = ledger
        self._config = config
        self._worktrees = worktrees
        self._wall = wall
        self._is_busy = is_busy
        self._fleet = fleet
        self._sleep_until = sleep_until

    async def sweep_worktrees(self, *, dry_run: bool = False) -> SweepReport:
        """Remove the clean worktrees of idle conversations now (see sweeper.py)."""
        worktrees = self._worktrees()
        if worktrees is None:
            return SweepReport(())
        now, idle = self._wall(), self._config().retention.idle.total_seconds()
        is_busy = self._is_busy
        if self._fleet is not None:
            is_busy = await self._busy_in_fleet(worktrees, now, idle)
        return await sweep(worktrees, now=now, idle=idle, is_busy=is_busy, dry_run=dry_run)

    async def _busy_in_fleet(self, worktrees: WorktreeManager, now: float, idle: float) -> IsBusy:
        """A member's sweep check: busy here, or a run queued or running anywhere in the fleet.

        Runs on other members that this one has not polled, or does not hold,
        are not in its scheduler: the ledger is asked once, before the sweep,
        about the conversations it will look at. (A run submitted elsewhere
        after that may find its worktrees removed: its start here makes them
        again, once the removal is done.)
        """
        assert self._fleet is not None
        store, here = self._fleet.store, self._is_busy
        candidates = [
            (folder.workspace, folder.conversation)
            for folder in idle_folders(worktrees, now=now, idle=idle)
        ]
        elsewhere = await self._ledger.call(lambda _: store.live_conversations(candidates))

        def is_busy(workspace: str, conversation: str) -> bool:
            if (workspace, conversation) in elsewhere:
                return True
            return here(workspace, conversation)

        return is_busy

    async def sweep_loop(self) -> None:
        """Sweep idle worktrees every ``retention.sweep_interval``."""
        # Settings are read afresh each time: a reload changes the next sweep.
        while True:
            started = trio.current_time()
            # Slept until an absolute time: the time left, recomputed from
            # the clock, can round to a sleep of nothing that never ends on
            # a clock that moves only once every task waits (the simulator's).
            while trio.current_time() < (
                due := started + self._config().retention.sweep_interval.total_seconds()
            ):
                await self._sleep_until(due)
            if self._worktrees() is None:
                continue
            try:
                await self.sweep_worktrees()
            except Exception:  # a sweep that fails is tried again next time
                log.exception("worktree sweep failed")

    async def prune_loop(self) -> None:
        """Prune runs finished longer ago than ``retention.finished_runs``."""
        while True:
            keep = self._config().retention.finished_runs.total_seconds()
            cutoff = self._wall() - keep
            try:
                pruned: int = await self._ledger.call(methodcaller("prune", cutoff))
            except StoreError as exc:  # a locked or full disk: try again next time
                log.warning("could not prune finished runs: %s", exc)
            else:
                if pruned:
                    log.info("pruned %d finished run(s) older than %s", pruned, keep)
            await self._sleep_until(trio.current_time() + min(3600.0, max(1.0, keep / 10)))
