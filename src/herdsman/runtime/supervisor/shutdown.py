"""Shutdown: drain, then, if asked again or past the grace, stop the running runs.

:class:`Shutdown` owns the two requests (drain, then force) and what they
set off: the lifecycle stops admitting and starting, the running runs get
the configured grace to finish, and those still running after it (or at a
second request) are stopped and recorded in submission order
(stop_order.py). It writes ``stop_order`` of the shared state.
"""

from __future__ import annotations

import logging

import trio

from herdsman.config import format_duration
from herdsman.runtime.stop_order import StopOrder
from herdsman.runtime.supervisor.errors import ShutdownReport
from herdsman.runtime.supervisor.shared import Service, Shared

__all__ = ["FORCED_STOP_WAIT", "Shutdown"]

log = logging.getLogger("herdsman.supervisor")

#: How long, after cancelling them, running runs may take to stop before their
#: tasks are cancelled outright (the runner's kill grace is 5 s).
FORCED_STOP_WAIT = 15.0


class Shutdown(Service):
    """The supervisor's way down: :meth:`request_shutdown`, then :meth:`shutdown_when_asked`."""

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        self._drain_requested = trio.Event()
        self._force_requested = trio.Event()

    def request_shutdown(self) -> None:
        """First call: stop admitting and drain. Second call: cancel running runs."""
        if self._drain_requested.is_set():
            self._force_requested.set()
        else:
            self._drain_requested.set()

    async def shutdown_when_asked(self) -> ShutdownReport:
        await self._drain_requested.wait()
        self._life.drain()
        # In the trace, after every start decided before it: a replay then
        # stops starting runs exactly where production did.
        await self._shared.emit_in_ledger_order("shutdown")
        grace = self._shared.config.supervisor.shutdown_grace
        if self._handles:
            log.info(
                "shutting down: %d running run(s) may finish within %s",
                len(self._handles),
                format_duration(grace),
            )
        grace_seconds = grace.total_seconds()
        with trio.move_on_after(grace_seconds):
            async with trio.open_nursery() as race:

                async def on_force() -> None:
                    await self._force_requested.wait()
                    race.cancel_scope.cancel()

                async def on_idle() -> None:
                    await self._wait_idle()
                    race.cancel_scope.cancel()

                race.start_soon(on_force)
                race.start_soon(on_idle)
        cancelled = tuple(self._handles)
        if cancelled:
            await self._shared.emit_in_ledger_order("shutdown", forced=True)
            # Those still running once the event is out (a run may have ended
            # while it was written); their ends are recorded in submission
            # order, not in the order their processes exit (stop_order.py).
            cancelled = tuple(self._handles)
            log.warning("cancelling %d running run(s)", len(cancelled))
            self._shared.stop_order = StopOrder(cancelled, trio.current_time() + FORCED_STOP_WAIT)
            for run_id in cancelled:
                self._shared.stop(run_id, "supervisor shut down")
            # A finish the ledger keeps refusing is given up on: the lease
            # expiry after this member has gone reports the run lost.
            for retrying in self._shared.finish_retries.values():
                retrying.cancel()
            # Process groups get SIGTERM, then SIGKILL after the kill grace;
            # anything still not done after that is cancelled outright (its
            # task still records it, shielded).
            with trio.move_on_after(FORCED_STOP_WAIT):
                await self._wait_idle()
            if self._handles:
                log.error("%d run(s) did not stop; cancelling their tasks", len(self._handles))
                assert self._shared.nursery is not None
                self._shared.nursery.cancel_scope.cancel()
                # Shielded: this runs inside that nursery, whose cancel would
                # end the wait at once (and leave no report to return).
                with trio.CancelScope(shield=True):
                    await self._wait_idle()
        return ShutdownReport(drained=not cancelled, cancelled=cancelled, fatal=self._shared.fatal)

    async def _wait_idle(self) -> None:
        while self._handles:
            self._shared.idle = trio.Event()
            await self._shared.idle.wait()
