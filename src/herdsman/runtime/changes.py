"""A counter of the supervisor's state changes, for whoever shows its state live.

The supervisor calls :meth:`Changes.touch` wherever what it would show may
have changed (a run queued, started or ended, a reload, an account's rest);
the dashboard waits on :meth:`Changes.wait_past` and reads the state once
for all its pages. A touch with nobody waiting adds one to a counter and
nothing else, so the supervisor pays nothing for a dashboard nobody watches.
"""

from __future__ import annotations

import trio


class Changes:
    """How many changes there have been, and a way to wait for the next one."""

    def __init__(self) -> None:
        #: Changes so far; only ever grows.
        self.count = 0
        self._next: trio.Event | None = None

    def touch(self) -> None:
        """Something shown may have changed: wake whoever waits."""
        self.count += 1
        if self._next is not None:
            self._next.set()
            self._next = None

    async def wait_past(self, seen: int) -> int:
        """Wait until :attr:`count` is past ``seen``; return it."""
        while self.count <= seen:
            if self._next is None:
                self._next = trio.Event()
            await self._next.wait()
        return self.count
