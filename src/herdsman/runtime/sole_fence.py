"""A sole supervisor's fence keeper: its agents die with it.

Agents run in process groups of their own, so a supervisor that holds its
ledger alone and is killed (``kill -9``, the OOM killer) would leave them
running for as long as nobody restarts it: still working in their
conversations' worktrees, still spending the accounts. A restart reports
their runs lost and stops what is left (orphans.py), but that may be never.
So ``herdsman run`` starts, for a sole supervisor too, the fence keeper of
fleet members (fence_keeper.py), without a deadline: it kills the agents
under the state directory when its pipe closes, that is when the
supervisor has exited, however. One mechanism for both.

A fleet member whose keeper dies or is stopped (it kills nothing then)
stops (its agents could outlive its lease and overlap runs on other
machines). A sole supervisor does not: while it
runs, it stops its own agents and nothing else runs its conversations, so
its keeper is only the backstop for its own death. Stopping would cancel
every running run to guard against a death that may never come; it logs an
error instead and starts a new keeper, which finds the agents already
running as well as later ones (it looks for them in ``/proc`` only when it
kills). docs/operations.md says so.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Final

import trio

from herdsman.runtime.fence import Fence

__all__ = ["RESTART_PAUSE", "SoleFence"]

log = logging.getLogger("herdsman")

#: Seconds between a keeper's death and the start of the next one (and
#: between failed starts): a keeper that dies at once is not restarted in a
#: tight loop.
RESTART_PAUSE: Final = 1.0


class SoleFence:
    """The fence keeper of a supervisor that holds its ledger alone, started again if it dies."""

    def __init__(self, state_dir: Path, fence: Fence) -> None:
        """Take over ``fence``, keeper of the agents under ``state_dir`` (see :meth:`start`)."""
        self.state_dir = state_dir
        #: The keeper now in charge.
        self.fence = fence

    @classmethod
    async def start(cls, state_dir: Path) -> SoleFence:
        """Start the keeper of the agents under ``state_dir``: before any agent is spawned."""
        return cls(state_dir, await Fence.start(state_dir))

    async def keep(self) -> None:
        """Until cancelled: when the keeper dies or is stopped, log an error and start another."""
        while True:
            why = await self.fence.wait_fallen()
            await self.fence.discard()  # reaped, its pipe closed
            log.error(
                "%s; until a new one runs, this supervisor's agents would outlive it if it were"
                " killed; starting a new fence keeper",
                why,
            )
            self.fence = await self._restart()

    async def _restart(self) -> Fence:
        while True:
            await trio.sleep(RESTART_PAUSE)
            try:
                fence = await Fence.start(self.state_dir)
            except OSError as exc:
                log.error("could not start a new fence keeper: %s; trying again", exc)
                continue
            log.warning("started a new fence keeper (pid %d)", fence.pid)
            return fence

    async def close(self) -> None:
        """Close the keeper's pipe once the supervisor is done with its agents.

        The keeper kills any agent still under the state directory (none,
        after a drain or the cancels of a shutdown) and exits.
        """
        await self.fence.close()
