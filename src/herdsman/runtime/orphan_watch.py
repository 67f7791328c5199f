"""Orphaned agents of a fleet member's previous process on this state directory.

A sole supervisor killed without cleanup (``kill -9``, a crash) finds its
runs still ``running`` at the next start, records them lost and stops their
agents at once (orphans.py). A fleet member cannot: its previous process's
runs stay ``running``, held by the previous member, until that member's
lease lapses and a live member expires it (docs/fleet.md). Until then the
fleet counts them as running, and their agents are left alone.

So a member, at start, finds every agent started under its state directory
(none is its own yet: the state directory's lock file allows one supervisor
on it at a time) and watches their runs in the ledger: each agent is stopped
once its run is no longer ``running`` — at start if it is lost already, else
when the expiry is seen. A run of this member that shares a conversation or
agent key with a watched agent waits, before it prepares anything, until that
agent is stopped: the expiry that freed its lane may be another member's,
seen here up to one check later, and the agent may be working in the very
worktree the run is about to use.
"""

from __future__ import annotations

from pathlib import Path

import trio

from herdsman.core import RunRequest, busy_keys
from herdsman.runtime.ledger import Ledger
from herdsman.runtime.orphans import agents_under, stop_orphans
from herdsman.runtime.requests import run_request
from herdsman.runtime.store import RunRecord, RunStatus, Store

__all__ = ["OrphanWatch"]


class OrphanWatch:
    """The orphaned agents of earlier processes under ``state_dir``, until each is stopped.

    ``agent_exclusive``: whether the agent key is a lane (``[scheduling]
    agent_exclusive``), so whether a run waits for an orphaned agent of its agent.
    """

    def __init__(self, state_dir: Path, *, agent_exclusive: bool) -> None:
        """Watch nothing yet: :meth:`find` looks for orphaned agents."""
        self.state_dir = state_dir
        self.agent_exclusive = agent_exclusive
        # Watched run id -> the keys its agent holds until stopped.
        self._runs: dict[str, tuple[str, ...]] = {}
        # Key -> set once no watched agent holds it any more.
        self._cleared: dict[str, trio.Event] = {}

    @property
    def watched(self) -> tuple[str, ...]:
        """The runs whose orphaned agents are still watched, by id."""
        return tuple(sorted(self._runs))

    async def find(self, ledger: Ledger) -> None:
        """Look for agents started under the state directory; watch those of known runs.

        Call before this process starts anything: every agent found is then
        an earlier process's. An agent whose run the ledger does not know is
        left alone (it is not the ledger's to judge).
        """
        found = await trio.to_thread.run_sync(agents_under, self.state_dir)
        if not found:
            return
        records = await ledger.call(lambda store: _records(store, sorted(found)))
        for record in records:
            if record is not None:
                keys = busy_keys(run_request(record), agent_exclusive=self.agent_exclusive)
                self._runs[record.id] = keys
                for key in keys:
                    self._cleared.setdefault(key, trio.Event())

    async def stop_ended(self, ledger: Ledger, grace: float) -> dict[str, set[int]]:
        """Stop the agents of watched runs the ledger no longer has running.

        A run still ``running`` is held by a live member as far as the fleet
        knows (the previous process, until its lease is expired): its agent
        is left alone and watched on. Returns the process groups stopped, by
        run id; a run whose agent had ended by itself is just no longer watched.
        """
        if not self._runs:
            return {}
        ids = sorted(self._runs)
        records = await ledger.call(lambda store: _records(store, ids))
        # A run gone from the ledger was pruned, so it had ended long ago.
        ended = [
            run_id
            for run_id, record in zip(ids, records, strict=True)
            if record is None or record.status is not RunStatus.RUNNING
        ]
        if not ended:
            return {}
        stopped = await stop_orphans(ended, self.state_dir, grace)
        for run_id in ended:
            del self._runs[run_id]
        held = {key for keys in self._runs.values() for key in keys}
        for key in [key for key in self._cleared if key not in held]:
            self._cleared.pop(key).set()
        return stopped

    async def clear_of(self, run: RunRequest) -> None:
        """Return once no watched agent holds a conversation or agent key of ``run``."""
        for key in busy_keys(run, agent_exclusive=self.agent_exclusive):
            cleared = self._cleared.get(key)
            if cleared is not None:
                await cleared.wait()


def _records(store: Store, run_ids: list[str]) -> list[RunRecord | None]:
    return [store.get(run_id) for run_id in run_ids]
