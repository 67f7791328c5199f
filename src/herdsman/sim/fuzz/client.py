"""The fuzz's client and watches: requests sent in order as from one connection, and the
step counter that stops a run whose simulated clock never moves.

:mod:`herdsman.sim.fuzz.harness` runs the scenario with them; a liveness
violation names its event with :func:`_describe`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio
import trio.testing

from herdsman.sim.bounds import STEPS_AT_ONE_INSTANT, STOP_GRACE
from herdsman.sim.trio_internals import mock_time

if TYPE_CHECKING:
    from herdsman.sim.fuzz.harness import _Fuzz

#: How long (simulated) a client's request may take to return: a submit may
#: wait out the removal of its conversation's worktrees (a few slow git
#: calls), never this long.
REQUEST_BOUND = STOP_GRACE
#: How long (wall-clock seconds) the driver waits between looks at a thread at work.
_THREAD_CUSHION = 0.0002


def _describe(event: Mapping[str, Any]) -> str:
    """An event in a few words, with its time: what a liveness violation names."""
    kind = event["kind"]
    if kind == "submit":
        what = f"the submit of {event['run']['id']}" + (" sent again" if event.get("again") else "")
    elif kind == "cancel":
        what = f"the cancel of {', '.join(event['run_ids'])}"
    elif kind == "git_failure":
        what = f"the git failure of {event['operation']}"
    else:
        what = f"the {kind.replace('_', ' ')}"
    return f"{what} at t={float(event['t']):.3f}"


class _Client:
    """The clients' requests (submits, cancels, reloads), sent in order, each once the one
    before has returned: as from one connection.

    The driver hands a request over and goes on moving the clock, so a
    request that waits for simulated time (a submit waiting out its
    conversation's worktree removal under slow git) gets it. One at a time
    and in order: which of two requests goes first never depends on
    trio's wake-up order.
    """

    def __init__(self, fuzz: _Fuzz) -> None:
        self._fuzz = fuzz
        channel = trio.open_memory_channel[tuple[str, Callable[[], Awaitable[None]]]]
        self._send, self._receive = channel(math.inf)
        #: Requests sent and not yet returned (or dropped by a crash).
        self._waiting: list[str] = []
        self._scope: trio.CancelScope | None = None
        #: When the request under way was made (simulated), if one is.
        self._since: float | None = None

    @property
    def busy(self) -> bool:
        """Whether a request is under way or waiting its turn."""
        return bool(self._waiting)

    async def hand_over(self, what: str, request: Callable[[], Awaitable[None]]) -> None:
        """Send ``request`` (``what`` names it) after those sent before it.

        Back once every task waits and no thread of trio's is at work: a
        reload reads the file in a thread, and while it does nothing may
        move on (not the clock, not the next event), or the thread's speed
        would decide what happens next.
        """
        self.send(what, request)
        await trio.testing.wait_all_tasks_blocked()
        threads = trio.to_thread.current_default_thread_limiter()
        while threads.statistics().borrowed_tokens:
            await trio.testing.wait_all_tasks_blocked(_THREAD_CUSHION)

    def send(self, what: str, request: Callable[[], Awaitable[None]]) -> None:
        """Send ``request`` after those sent before it, and go on at once."""
        self._waiting.append(what)
        self._send.send_nowait((what, request))

    async def serve(self) -> None:
        """Make the requests, one at a time, each while a supervisor is up."""
        async for _, request in self._receive:
            await self._fuzz.up.wait()
            self._since = trio.current_time()
            with trio.CancelScope() as self._scope:
                await request()
            self._scope = self._since = None
            self._waiting.pop(0)

    def drop(self) -> None:
        """The supervisor died: the request under way gets no answer."""
        if self._scope is not None:
            self._scope.cancel()

    def answered(self, *, by_now: bool = True) -> None:
        """A liveness violation if a request has not returned: by now (the events
        are over), or else within REQUEST_BOUND of being made."""
        if not self._waiting:
            return
        late = self._since is not None and trio.current_time() - self._since > REQUEST_BOUND
        if by_now or late:
            notes = []
            if self._since is not None and not self._waiting[0].endswith(f"t={self._since:.3f}"):
                notes.append(f"made at t={self._since:.3f}, after those before it")
            if len(self._waiting) > 1:
                notes.append(f"{len(self._waiting) - 1} more behind it")
            more = f" ({'; '.join(notes)})" if notes else ""
            self._fuzz.checker.fail("liveness", f"{self._waiting[0]} never returned{more}")


class _SpinWatch(trio.abc.Instrument):
    """Counts task steps at one simulated instant: a run whose clock never moves is stopped.

    A loop that yields but never waits (tasks that keep waking each other)
    keeps every wait for blocked tasks, the driver's among them, from
    returning: the clock stays put for ever, with the CPU busy. Steps are
    counted, not seconds: the same seed stops at the same step.
    """

    def __init__(self, fuzz: _Fuzz, clock: trio.testing.MockClock) -> None:
        self._fuzz = fuzz
        self._now = mock_time(clock)
        self._at = -1.0
        self._steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._fuzz.bound.freeze:
            self._fuzz.abandon()
        now = self._now()
        if now != self._at:
            self._at, self._steps = now, 0
            return
        self._steps += 1
        if self._steps % STEPS_AT_ONE_INSTANT == 0:
            # Between steps, not inside one: a cancellation is safe there.
            trio.lowlevel.current_trio_token().run_sync_soon(
                self._fuzz.stall,
                f"{self._steps} task steps at t={now:.3f} and the clock never moved",
            )
