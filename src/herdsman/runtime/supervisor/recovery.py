"""Recovery: what a supervisor takes over from the ledger when it starts.

:class:`Recovery` records as lost the runs a sole supervisor finds running
(an earlier process died with them), stops their agents that outlived it,
queues the runs still queued, and restores the accounts' rests and usage.
A fleet member recovers no run (others may run them): it stops its earlier
process's orphaned agents once their runs have ended, and polls the fleet.
"""

from __future__ import annotations

import logging

from herdsman.runtime.orphan_watch import OrphanWatch
from herdsman.runtime.orphans import stop_orphans
from herdsman.runtime.requests import run_request, trace_run
from herdsman.runtime.store import RunStatus
from herdsman.runtime.supervisor.accounts import AccountTracker
from herdsman.runtime.supervisor.fleet import ORPHAN_GRACE, Membership, note_stopped
from herdsman.runtime.supervisor.shared import Service, Shared

__all__ = ["Recovery"]

log = logging.getLogger("herdsman.supervisor")


class Recovery(Service):
    """The start-up's recovery; ``lost_at_startup`` names the runs it recorded lost.

    ``stop_orphans``: stop agents of lost runs that outlived the previous
    process (the simulator, which spawns nothing, turns it off).
    """

    def __init__(
        self,
        shared: Shared,
        *,
        tracker: AccountTracker,
        membership: Membership | None,
        orphans: OrphanWatch | None,
        stop_orphans: bool,
    ) -> None:
        super().__init__(shared)
        self._tracker = tracker
        self._membership = membership
        self._orphans = orphans
        self._stop_orphans = stop_orphans
        self.lost_at_startup: tuple[str, ...] = ()

    @property
    def _trace_prompts(self) -> bool:
        return self._shared.trace_prompts

    async def recover(self) -> None:
        now = self._wall()
        if self._membership is not None:
            # A member recovers nothing: other members may be running the
            # runs it finds running; a dead member's runs are lost by expiry.
            if self._orphans is not None:
                await self._orphans.find(self.ledger)
                await self._membership.stop_ended_orphans()
            await self._membership.fleet_poll()
            await self._tracker.recover(now, self._shared.config)
            return
        lost = await self.ledger.call(lambda s: s.recover(now))
        self.lost_at_startup = tuple(r.id for r in lost)
        for record in lost:
            log.warning(
                "run %s was running when the supervisor stopped: recorded as lost", record.id
            )
            self._emit("lost", run_id=record.id)
            if self._counts_runs:
                self.metrics.count_finish(record.provider, RunStatus.LOST.value)
        if lost and self._stop_orphans:
            await self._stop_orphaned_agents(self.lost_at_startup)
        for record in await self.ledger.call(lambda s: s.queued_in_order()):
            self._life.submit(run_request(record), now, attempts=record.attempts)
            self._submitted_at[record.id] = record.submitted_at
            # This trace file starts here: it restates what is queued, so it
            # can be replayed on its own.
            self._emit(
                "submit", run=trace_run(record, with_prompt=self._trace_prompts), carried=True
            )
        await self._tracker.recover(now, self._shared.config)

    async def _stop_orphaned_agents(self, run_ids: tuple[str, ...]) -> None:
        """Stop agents of lost runs still running, before anything new starts.

        Left alone, one would keep working in its conversation's worktree
        while the conversation's next run starts there.
        """
        state_dir = self._shared.config.supervisor.state_dir
        orphans = await stop_orphans(run_ids, state_dir, ORPHAN_GRACE)
        await note_stopped(self.ledger, orphans)
