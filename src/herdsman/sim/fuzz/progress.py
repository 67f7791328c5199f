"""What ``herdsman sim fuzz`` shows while it runs: the seeds done, the ones running, a slow one.

On a terminal, one status line rewritten in place (about twice a
second): seeds done of the batch, runs and faults so far, seeds a second,
and each seed running with its runs, faults and how long it has taken —
so a slow seed shows as it happens. Elsewhere (a log, a pipe), plain
lines: one every ``every`` seconds, and one for each seed still running
after ``slow`` seconds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

from herdsman.sim.fuzz.harness import Verdict
from herdsman.sim.fuzz.scenario import FAULT_KINDS, Scenario

__all__ = ["Progress"]


def _faults_drawn(scenario: Scenario) -> int:
    """The scenario's faults: every event but a first submit (one sent again is a fault)."""
    return sum(
        1
        for e in scenario.events
        if e["kind"] in FAULT_KINDS or (e["kind"] == "submit" and e.get("again"))
    )


class Progress:
    """Follows a batch (``started``/``finished`` callbacks) and shows it on ``stream``.

    A context manager: its ticker thread redraws while seeds run, and the
    terminal's line is cleared at the end.
    """

    def __init__(
        self,
        stream: TextIO,
        total: int,
        *,
        tty: bool,
        every: float = 10.0,
        slow: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        columns: int = 80,
    ) -> None:
        self._stream = stream
        self._total = total
        self._tty = tty
        self._every = every
        self._slow = slow
        self._clock = clock
        self._lock = threading.Lock()
        self._began = clock()
        self._last_line = self._began
        #: Seeds running: when each began, its scenario.
        self._running: dict[int, tuple[float, Scenario]] = {}
        self._reported_slow: set[int] = set()
        self._done = self._runs = self._faults = 0
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._width = 0
        self._columns = columns

    def __enter__(self) -> Progress:
        self._ticker = threading.Thread(target=self._tick_on, name="fuzz-progress", daemon=True)
        self._ticker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self._tty and self._width:
                self._stream.write("\r" + " " * self._width + "\r")
                self._stream.flush()

    def started(self, scenario: Scenario) -> None:
        """A seed was handed to a worker."""
        with self._lock:
            self._running[scenario.seed] = (self._clock(), scenario)

    def ended(self, seed: int) -> None:
        """A seed's run ended (its verdict is counted when it comes, in seed order)."""
        with self._lock:
            self._running.pop(seed, None)

    def finished(self, verdict: Verdict) -> None:
        """A seed's verdict came in (in seed order)."""
        with self._lock:
            self._running.pop(verdict.scenario.seed, None)
            self._done += 1
            self._runs += verdict.scenario.run_count
            self._faults += verdict.faults
        self.tick()

    def _tick_on(self) -> None:
        while not self._stop.wait(0.5 if self._tty else 1.0):
            self.tick()

    def tick(self) -> None:
        """Show where the batch stands (a terminal's line; plain lines when due)."""
        with self._lock:
            now = self._clock()
            if self._tty:
                self._draw(now)
                return
            for seed, (began, scenario) in sorted(self._running.items()):
                if now - began >= self._slow and seed not in self._reported_slow:
                    self._reported_slow.add(seed)
                    about = self._about(scenario)
                    self._line(f"seed {seed}: still running after {now - began:.0f}s ({about})")
            if now - self._last_line >= self._every:
                self._last_line = now
                self._line(self._summary(now))

    def _summary(self, now: float) -> str:
        elapsed = max(now - self._began, 1e-9)
        return (
            f"{self._done}/{self._total} seeds, {self._runs} runs, {self._faults} faults,"
            f" {self._done / elapsed:.2f} seeds/s"
        )

    @staticmethod
    def _about(scenario: Scenario) -> str:
        latency = f", git {scenario.git_latency:g}s" if scenario.git_latency else ""
        return f"{scenario.run_count} runs, {_faults_drawn(scenario)} faults{latency}"

    def _draw(self, now: float) -> None:
        # The longest running first: a slow seed is what stays in sight.
        running = [
            f"seed {seed} {now - began:.0f}s: {self._about(scenario)}"
            for seed, (began, scenario) in sorted(
                self._running.items(), key=lambda item: (item[1][0], item[0])
            )
        ]
        elapsed = max(now - self._began, 1e-9)
        text = (
            f"{self._done}/{self._total} seeds {self._done / elapsed:.1f}/s,"
            f" {self._runs} runs, {self._faults} faults"
        ) + (" | " + "; ".join(running) if running else "")
        # One line, never wrapped: a wrapped line cannot be rewritten in place.
        text = text[: max(self._columns - 1, 20)]
        pad = max(self._width - len(text), 0)
        self._stream.write("\r" + text + " " * pad)
        self._stream.flush()
        self._width = len(text)

    def _line(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()
