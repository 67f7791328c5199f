"""The retention loops' sleeps end on a clock that moves only when every task waits.

The simulator's MockClock jumps to the next deadline once everything is
blocked. A sleep computed as "the interval minus the time gone by" could
round to a few ulps that end at once without the clock moving, forever:
the supervisor spun and the replay hung (found by ``herdsman sim fuzz``,
seed 6: a restart at t=241.992 with a two-minute sweep interval).
"""

from __future__ import annotations

import threading
from pathlib import Path

import trio
import trio.testing

from herdsman.config import load_config_text
from herdsman.runtime.ledger import inline
from herdsman.runtime.store import MemoryStore
from herdsman.runtime.supervisor import Supervisor

CONFIG = """\
[supervisor]
state_dir = "{state}"
[retention]
sweep_interval = "2m"
[providers.claude]
exec = ["claude"]
"""


def _sweep_cycles(state: Path, start: float, cycles: int) -> list[float]:
    """Start a supervisor at ``start``; jump from deadline to deadline ``cycles`` times."""
    clock = trio.testing.MockClock()
    loaded = load_config_text(CONFIG.format(state=state), state / "s.toml", environ={})
    times: list[float] = []

    async def main() -> None:
        clock.jump(start)
        supervisor = Supervisor(
            loaded.config, MemoryStore(), run_sync=inline, stop_orphans=False, wall=lambda: 0.0
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            for _ in range(cycles):
                await trio.testing.wait_all_tasks_blocked()
                clock.jump(trio.lowlevel.current_statistics().seconds_to_next_deadline)
                times.append(trio.current_time())
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=clock)
    return times


def test_sweep_sleeps_end_when_the_clock_reaches_them(tmp_path: Path) -> None:
    times: list[float] = []
    # In a thread: the spin this guards against never yields to anything that
    # could stop it, so the test gives it half a minute of real time and looks.
    worker = threading.Thread(
        target=lambda: times.extend(_sweep_cycles(tmp_path, 241.992, 8)), daemon=True
    )
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the supervisor spun at a sweep deadline"
    # Each jump reached a timer: the sweep's every two minutes, the prune's hourly.
    assert len(times) == 8
    assert times[-1] >= 241.992 + 7 * 120 - 1e-6
