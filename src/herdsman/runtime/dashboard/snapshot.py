"""What the dashboard shows, read once per change for every open page.

:class:`Snapshots` turns the supervisor's :class:`~herdsman.runtime.changes.Changes`
into JSON snapshots of its state. Changes that come close together are
coalesced: the first waiter after a change lets the burst settle, reads the
state once and encodes it once, and every open page is sent those same
bytes. However many pages are open, the pages that follow the changes read
the supervisor at most once per ``min_gap`` seconds, and not at all while
nothing changes; a page that opens after a change reads at once, and pages
that open together share that read.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from herdsman.account_text import usage_text
from herdsman.runtime.api.ledger_answers import unavailable
from herdsman.runtime.changes import Changes
from herdsman.runtime.dashboard.logs import last_output
from herdsman.runtime.store import RunRecord, RunStatus, StoreError

if TYPE_CHECKING:
    from herdsman.runtime.supervisor import Supervisor

#: Runs in the "recent" list of a snapshot (the timeline asks for more once).
RECENT = 100
#: Queued and running runs a snapshot lists at most (counts are always whole).
LISTED = 500
#: A prompt is shown cut to this many characters.
PROMPT_SHOWN = 200

_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def brief_run(record: RunRecord) -> dict[str, Any]:
    """A run as the dashboard lists it: no result, excerpt or metadata, the prompt cut."""
    prompt = record.prompt
    return {
        "id": record.id,
        "status": record.status.value,
        "provider": record.provider,
        "workspace": record.workspace,
        "conversation": record.conversation,
        "agent": record.agent,
        "account": record.account,
        "seq": record.seq,
        "submitted_at": record.submitted_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "exit_code": record.exit_code,
        "reason": record.reason,
        "attempts": record.attempts,
        "prompt": prompt[:PROMPT_SHOWN] if prompt is not None else None,
    }


async def read_state(supervisor: Supervisor) -> dict[str, Any]:
    """Everything the dashboard's views show but worktrees (slow) and logs (large).

    A ledger that fails leaves the lists of runs empty and says why in
    ``ledger_error``: the counts, accounts and configuration are still shown.
    """
    status = supervisor.status()
    for account in status["accounts"]:
        # Worded as `herdsman accounts` words it, by the same code: the page
        # shows this text rather than repeat the CLI's rules for each unit.
        account["usage_text"] = usage_text(account)
    fleet = await supervisor.fleet_status()
    ledger_error = None
    try:
        running = await supervisor.list_runs(status=RunStatus.RUNNING, limit=LISTED)
        queued = await supervisor.list_runs(status=RunStatus.QUEUED, limit=LISTED)
        recent = await supervisor.list_runs(limit=RECENT)
    except StoreError as exc:
        running, queued, recent = [], [], []
        ledger_error = unavailable(exc)
    state_dir = supervisor.config.supervisor.state_dir
    running_rows = []
    for record in running:
        row = brief_run(record)
        row["last_output_at"] = last_output(state_dir, record.id)
        running_rows.append(row)
    # Oldest first: a conversation's runs start in this order (its lane order).
    queued_rows = [brief_run(record) for record in sorted(queued, key=lambda r: r.seq)]
    config = supervisor.config
    return {
        "status": status,
        "fleet": fleet,
        "providers": {
            name: {"concurrency": provider.concurrency}
            for name, provider in config.providers.items()
        },
        "running": running_rows,
        "queued": queued_rows,
        "recent": [brief_run(record) for record in recent],
        "ledger_error": ledger_error,
    }


class Snapshots:
    """The latest snapshot of the state, rebuilt once per coalesced burst of changes.

    ``read`` gives the state as a JSON-able value, ``wall`` the unix time it
    was read at (the page's clock may differ from the server's). Snapshots
    are numbered from 1; :meth:`after` waits for one newer than the number a
    page has.
    """

    def __init__(
        self,
        changes: Changes,
        read: Callable[[], Awaitable[Any]],
        wall: Callable[[], float],
        *,
        settle: float = 0.2,
        min_gap: float = 1.0,
    ) -> None:
        self._changes = changes
        self._read = read
        self._wall = wall
        self._settle = settle
        self._min_gap = min_gap
        self._lock = trio.Lock()
        #: The number of the latest snapshot (0: none built yet).
        self.number = 0
        #: The latest snapshot, encoded as compact UTF-8 JSON.
        self.payload = b""
        #: How many snapshots were built (the benchmark and tests read it).
        self.built = 0
        self._seen = -1  # the change count the latest snapshot reflects
        self._built_at = -float("inf")

    async def current(self) -> tuple[int, bytes]:
        """The latest snapshot, rebuilt first if the state changed since.

        It reads at once, without waiting for ``settle`` or ``min_gap``
        (a page that opens wants the state now), but a page is content with
        any read that saw every change made before it asked, so pages that
        open together cost one read.
        """
        wanted = self._changes.count
        if self._seen < wanted or not self.number:
            await self._rebuild(wanted, settle=False)
        return self.number, self.payload

    async def after(self, number: int) -> tuple[int, bytes]:
        """The first snapshot newer than ``number``, waiting for a change if need be."""
        while self.number <= number:
            wanted = await self._changes.wait_past(self._seen)
            await self._rebuild(wanted, settle=True)
        return self.number, self.payload

    async def _rebuild(self, wanted: int, *, settle: bool) -> None:
        # One page rebuilds; the others wait on the lock and find it done.
        # Done means a read that saw the changes up to `wanted`, the count
        # when this page asked: a change that lands while it waits for the
        # lock is for the next read, or whether it reads again would depend
        # on which task trio happens to wake first.
        async with self._lock:
            if self._seen >= wanted and self.number:
                return
            if settle:
                # Let the burst settle (a finish wakes, notifies and starts
                # the next run within moments), and never rebuild more often
                # than min_gap, whatever the rate of changes.
                await trio.sleep_until(
                    max(trio.current_time() + self._settle, self._built_at + self._min_gap)
                )
            seen = self._changes.count
            state = await self._read()
            body = {"number": self.number + 1, "at": self._wall(), "state": state}
            self.payload = _ENCODER.encode(body).encode("utf-8")
            self.number += 1
            self.built += 1
            self._seen = seen
            self._built_at = trio.current_time()
