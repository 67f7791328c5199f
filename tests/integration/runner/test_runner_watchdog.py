"""The watchdog shares the exit wait: deadlines that move, runs without limits."""

from __future__ import annotations

import time
from pathlib import Path

from runner_helpers import demo, grandchild_pid, make_spec, script, wait_gone

from herdsman.runtime.runner import execute
from herdsman.runtime.runner.spec import Outcome

# Prints a line every 0.05 s, alternating stdout and stderr, for 30 s.
TICKER = (
    "import sys, time\n"
    "for i in range(600):\n"
    "    stream = sys.stdout if i % 2 else sys.stderr\n"
    "    stream.write(f'tick {i}\\n'); stream.flush(); time.sleep(0.05)\n"
)


async def test_the_wall_clock_timeout_fires_while_output_keeps_moving_the_idle_deadline(
    tmp_path: Path,
) -> None:
    # The idle deadline passes many times over and is pushed back by output
    # every time; only the wall-clock timeout may end the run.
    spec = make_spec(tmp_path, argv=script(TICKER), idle_timeout=0.3, timeout=1.0)
    started = time.monotonic()
    outcome = await execute(spec)
    elapsed = time.monotonic() - started
    assert outcome.status is Outcome.TIMED_OUT
    assert outcome.limit == "timeout"
    assert outcome.reason == "wall-clock timeout of 1s exceeded"
    assert 0.9 < elapsed < 4
    assert "tick 1" in outcome.excerpt


async def test_idle_timeout_fires_once_the_output_stops(tmp_path: Path) -> None:
    code = (
        "import sys, time\n"
        "for i in range(6):\n"
        "    print(f'tick {i}', flush=True); time.sleep(0.05)\n"
        "time.sleep(30)\n"
    )
    spec = make_spec(tmp_path, argv=script(code), idle_timeout=0.4, timeout=20)
    outcome = await execute(spec)
    assert outcome.status is Outcome.TIMED_OUT
    assert outcome.limit == "idle_timeout"
    assert outcome.reason == "no output for 0.4s (idle_timeout)"
    assert outcome.excerpt.endswith("tick 5\n")


async def test_a_run_without_limits_ends_when_its_child_exits(tmp_path: Path) -> None:
    code = "import time; time.sleep(0.3); print('done')"
    spec = make_spec(tmp_path, argv=script(code), timeout=None, idle_timeout=None)
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.result == "done\n"


async def test_a_limit_passing_after_the_child_exited_does_not_override_its_verdict(
    tmp_path: Path,
) -> None:
    # The child exits at once, but its grandchild holds the pipes: the runner
    # waits up to EXIT_EOF_GRACE (0.5 s) for them, silent for longer than the
    # idle timeout. The child ended by itself, so its own verdict stands.
    spec = make_spec(
        tmp_path, argv=demo("--delay", "0", "--spawn-grandchild"), idle_timeout=0.3, timeout=None
    )
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.limit is None
    assert outcome.result == "demo reply: say hello\n"
    grandchild = grandchild_pid(spec.log_path)
    assert grandchild is not None
    assert wait_gone(grandchild)
