"""A fleet member's side of the supervisor: polls, the lease, and orphaned agents.

:class:`Membership` (made only for a fleet member) queues the runs a poll of
the ledger finds, in the fleet's order, withdraws those that left the
ledger's queue and stops those another member was asked to cancel; it
keeps the lease (a lapsed lease stops the supervisor) and stops the agents
a previous process left once their runs' expiry is seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from operator import methodcaller
from typing import TYPE_CHECKING

import trio

from herdsman.core.runs import conversation_key
from herdsman.runtime.accounts import longest_window
from herdsman.runtime.fleet_accounts import read_fleet_accounts
from herdsman.runtime.ledger import Ledger
from herdsman.runtime.orphan_watch import OrphanWatch
from herdsman.runtime.orphans import stopped_note
from herdsman.runtime.requests import run_request, trace_run
from herdsman.runtime.store import RunRecord, StoreError
from herdsman.runtime.supervisor.accounts import AccountTracker
from herdsman.runtime.supervisor.shared import Service, Shared

if TYPE_CHECKING:
    from herdsman.runtime.store.fleet import Poll

__all__ = ["ORPHAN_GRACE", "Membership", "note_stopped"]

log = logging.getLogger("herdsman.supervisor")

#: How long an orphaned agent gets between SIGTERM and SIGKILL at start-up.
ORPHAN_GRACE = 5.0


def _conversation_keys(records: list[RunRecord]) -> list[str]:
    """One key per record in a conversation: each is claimed, and released, once."""
    return [
        conversation_key(record.workspace, record.conversation)
        for record in records
        if record.conversation is not None
    ]


async def note_stopped(ledger: Ledger, orphans: dict[str, set[int]]) -> None:
    """Say on each run that its agent outlived the previous process and was stopped."""
    for run_id, groups in sorted(orphans.items()):
        await ledger.call(methodcaller("add_note", run_id, stopped_note(groups)))


class Membership(Service):
    """The fleet member's tasks: polls, the lease and the orphans' watch.

    ``tracker`` takes the fleet's accounts at each poll; ``orphans`` (if the
    member stops orphaned agents) watches them; ``request_shutdown`` is
    called once the lease has lapsed.
    """

    def __init__(
        self,
        shared: Shared,
        *,
        tracker: AccountTracker,
        orphans: OrphanWatch | None,
        request_shutdown: Callable[[], None],
    ) -> None:
        super().__init__(shared)
        self._tracker = tracker
        self._orphans = orphans
        self._request_shutdown = request_shutdown

    async def fleet_poll(self) -> None:
        assert self._fleet is not None
        # Accounts first: parked runs go back to the queue (below) with an
        # account view at least as recent as the claim that refused them.
        store, now, window = self._fleet.store, self._wall(), longest_window(self._shared.config)
        await self.ledger.call(
            lambda _: read_fleet_accounts(store, now, window),
            then=partial(self._tracker.take_fleet, now=now),
        )
        held: list[RunRecord] = []
        queued = [run.id for run in self._life.scheduler.queued_runs()]
        await self.ledger.call(
            partial(self._fleet.read_new, queued),
            then=lambda records: held.extend(self._take_fleet_runs(records)),
        )
        if held:
            await self._take_after_removals(held)

    def _take_fleet_runs(self, poll: Poll) -> list[RunRecord]:
        """Queue the fleet's new and re-queued runs in their place by ``seq``; stop cancelled ones.

        Parked runs go back in their place; runs held here that another
        member was asked to cancel are stopped as a local cancel stops them.
        As a submit here waits for a removal of its conversation's worktrees
        under way, so does a run polled: it and every run after it are held
        back and returned, their conversations claimed so that no sweep
        starts removing more of them.
        """
        assert self._fleet is not None
        self._withdraw_left(poll.left)
        self._life.requeue_held()
        self._fleet.reopen()
        records = self._fleet.take_new(poll)
        worktrees = self._shared.worktrees
        cut = len(records)
        if worktrees is not None:
            cut = next(
                (
                    n
                    for n, record in enumerate(records)
                    if record.conversation is not None
                    and worktrees.removal_under_way(record.workspace, record.conversation)
                ),
                cut,
            )
        for record in records[:cut]:
            self._queue_polled(record)
        held = records[cut:]
        self._pending_keys.claim(_conversation_keys(held))
        for run_id, reason in poll.cancels:
            handle = self._handles.get(run_id)
            if handle is not None and not handle.cancelled:
                log.info("run %s: cancel asked through another member (%s)", run_id, reason)
                self._shared.stop(run_id, reason)
        self._wake()
        return held

    def _withdraw_left(self, left: list[str]) -> None:
        """Withdraw runs queued here that left the ledger's queue (taken, ended elsewhere).

        As a claim found ``gone`` does: nothing of them is traced or recorded
        here. Only runs still queued here: one taken for a start since the
        poll's ids were read is settled by its claim.
        """
        for run_id in left:
            if self._life.forget(run_id):
                self._submitted_at.pop(run_id, None)
                self._notify(run_id)

    async def _take_after_removals(self, held: list[RunRecord]) -> None:
        """Queue runs held back by :meth:`_take_fleet_runs` once the removals are done.

        Their records are as the poll read them, maybe long ago: the ledger
        is asked again which are still queued, and only those are queued.
        """
        worktrees = self._shared.worktrees
        assert worktrees is not None
        assert self._fleet is not None
        try:
            for record in held:
                if record.conversation is not None:
                    await worktrees.removal_finished(record.workspace, record.conversation)
        finally:
            self._pending_keys.release(_conversation_keys(held))
        store, ids = self._fleet.store, [record.id for record in held]
        try:
            left = set(await self.ledger.call(lambda _: store.left_queue(ids)))
        except StoreError as exc:
            # Queued as read: the next poll withdraws those that have left.
            log.error("could not read again which polled runs are still queued: %s", exc)
            left = set()
        for record in held:
            if record.id not in left:
                self._queue_polled(record)
        self._wake()

    def _queue_polled(self, record: RunRecord) -> None:
        if not self._life.adopt(run_request(record), seq=record.seq, attempts=record.attempts):
            return
        self._submitted_at[record.id] = record.submitted_at
        self._emit("submit", run=trace_run(record, with_prompt=self._shared.trace_prompts))

    async def fleet_lease_loop(self) -> None:
        assert self._fleet is not None
        await self._fleet.keep_lease(
            self.ledger, lambda: self._shared.config, self._wall, self._lease_expired
        )

    async def stop_ended_orphans(self) -> None:
        assert self._orphans is not None
        await note_stopped(self.ledger, await self._orphans.stop_ended(self.ledger, ORPHAN_GRACE))

    async def watch_orphans(self) -> None:
        """Stop orphaned agents as their runs' expiry is seen (by any member), until none is."""
        assert self._orphans is not None
        while self._orphans.watched:
            await trio.sleep(self._shared.poll_interval())
            try:
                await self.stop_ended_orphans()
            except StoreError as exc:
                log.error("could not read the runs of orphaned agents: %s", exc)

    def _lease_expired(self, message: str) -> None:
        # Its runs may be declared lost and run on elsewhere: none may go on
        # here (the fence keeper kills their agents anyway, docs/fleet.md).
        log.critical("%s; stopping its runs and the supervisor", message)
        self._shared.fatal = message
        self._request_shutdown()
        self._life.drain()  # now: the slots freed below must start nothing
        for run_id in sorted(self._handles):
            self._shared.stop(run_id, "this fleet member's lease ran out")
