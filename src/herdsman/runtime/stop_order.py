"""The order in which a forced stop's cancelled runs record their ends: submission order.

A forced stop (a second signal, or the shutdown grace running out) cancels
every running run at once. Each run's process then exits when the kernel
and the agent let it, and its task would record the end as soon as it woke:
the ledger and the trace would hold the ends in wake-up order, which no
replay can reproduce and which differs from one stop to the next. Instead
each cancelled run, once its process is over, waits until every other
cancelled run's process is over too (or is found to be over already), and
then they record one at a time in the order they were submitted (the
ledger's ``seq``).

A run that never stops (its process outlives the runner's kill grace),
or one that never gets a task (its start could not be recorded, so it was
never spawned), would hold the others back: the wait is bounded by the
forced stop's own deadline, after which whoever still waits records at
once, in whatever order it wakes.
"""

from __future__ import annotations

import heapq

import trio

__all__ = ["StopOrder"]


class StopOrder:
    """The turns of the runs one forced stop cancelled."""

    def __init__(self, run_ids: tuple[str, ...], deadline: float) -> None:
        #: Cancelled runs whose task has not reached the point of recording yet.
        self._waiting = set(run_ids)
        #: Runs at that point, by submission order, not yet let through.
        self._arrived: list[tuple[int, str]] = []
        self._turns: dict[str, trio.Event] = {}
        self._deadline = deadline

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._waiting or run_id in self._turns

    async def wait_turn(self, run_id: str, seq: int) -> None:
        """Wait until ``run_id`` (submitted ``seq``-th) may record its end.

        Shielded: a task cancelled outright still records its run (the
        supervisor's forced stop cancels the run nursery only after its own
        deadline, which also ends this wait).
        """
        if run_id not in self._waiting:
            return
        self._waiting.discard(run_id)
        turn = self._turns[run_id] = trio.Event()
        heapq.heappush(self._arrived, (seq, run_id))
        if not self._waiting:
            self._next()
        with trio.CancelScope(shield=True, deadline=self._deadline):
            await turn.wait()

    def done(self, run_id: str) -> None:
        """``run_id`` has recorded its end (or never waited): let the next one through."""
        if run_id in self._waiting:
            # It recorded before it could wait (its end was being recorded
            # when the stop came): nothing of it to wait for any more.
            self._waiting.discard(run_id)
            if not self._waiting:
                self._next()
            return
        if self._turns.pop(run_id, None) is not None:
            self._next()

    def _next(self) -> None:
        while self._arrived:
            _, run_id = heapq.heappop(self._arrived)
            turn = self._turns.get(run_id)
            if turn is not None:
                turn.set()
                return
