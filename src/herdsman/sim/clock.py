"""The replay's clock: simulated time that moves only when the driver moves it."""

from __future__ import annotations

import math

import trio

__all__ = ["DrivenClock"]

#: What the clock answers trio for a timer still to come: wait for ever, as
#: ``MockClock`` does when it is not running on its own. Only the driver's
#: jump brings the timer closer.
_NEVER_BY_ITSELF = 999_999_999.0


class DrivenClock(trio.abc.Clock):
    """A trio clock for the replay's driver: time stands still between its jumps.

    It keeps time exactly as ``trio.testing.MockClock`` at rate 0 does (a
    sum of the jumps, from 0), and it also remembers the deadline of the
    supervisor's next timer, which trio hands every clock before each wait
    for I/O (:meth:`deadline_to_sleep_time`, always given the earliest
    pending deadline). Once every task is blocked, that is the moment the
    driver must move time to if it comes before the next event: it reads
    :attr:`next_deadline` instead of asking trio's run statistics, which
    cost about as much as a whole task step, twice per run; and reading
    the time is one attribute, not the real clock and two calls.

    Nothing moves it but :meth:`jump`: a task waiting for a timer while
    nothing drives would wait for ever (the replay drives until the
    supervisor has stopped).
    """

    def __init__(self) -> None:
        self._now = 0.0
        #: The earliest pending deadline when trio last asked (``inf``: none).
        #: Exact whenever every task is blocked: trio asks before each wait,
        #: and wakes a ``wait_all_tasks_blocked`` only after such a wait.
        self.next_deadline = math.inf

    def start_clock(self) -> None:
        """Nothing to start: only :meth:`jump` moves this clock."""

    def current_time(self) -> float:
        """The simulated time, in seconds since the replay began."""
        return self._now

    def deadline_to_sleep_time(self, deadline: float) -> float:
        """Real seconds to wait for ``deadline``: none once due, else until the driver moves."""
        self.next_deadline = deadline
        return 0.0 if deadline <= self._now else _NEVER_BY_ITSELF

    def jump(self, seconds: float) -> None:
        """Move the time forward by ``seconds``."""
        if seconds < 0:
            raise ValueError("time can't go backwards")
        self._now += seconds
