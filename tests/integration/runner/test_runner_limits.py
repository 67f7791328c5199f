"""Limits and cancellation: the whole process group goes, grandchildren included."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import trio
from runner_helpers import (
    demo,
    grandchild_pid,
    is_gone,
    make_spec,
    run_into,
    script,
    wait_for_grandchild,
    wait_gone,
)

from herdsman.runtime.runner import ProcessOutcome, RunCancel, execute
from herdsman.runtime.runner.spec import Outcome


async def test_wall_clock_timeout_kills_the_child_and_its_grandchild(
    tmp_path: Path, exit_watch: str
) -> None:
    spec = make_spec(tmp_path, argv=demo("--delay", "30", "--spawn-grandchild"), timeout=0.5)
    outcomes: list[ProcessOutcome] = []
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        pid = await nursery.start(run_into, outcomes, spec)
    elapsed = time.monotonic() - started
    [outcome] = outcomes
    assert outcome.status is Outcome.TIMED_OUT
    assert outcome.limit == "timeout"
    assert outcome.reason == "wall-clock timeout of 0.5s exceeded"
    assert outcome.exit_code == -15  # SIGTERM was enough
    assert outcome.result is None
    assert elapsed < 3
    grandchild = grandchild_pid(spec.log_path)
    assert grandchild is not None
    assert is_gone(pid)
    assert wait_gone(grandchild)


async def test_idle_timeout_fires_on_a_silent_process(tmp_path: Path) -> None:
    code = "import time; print('started', flush=True); time.sleep(30)"
    spec = make_spec(tmp_path, argv=script(code), idle_timeout=0.3, timeout=20)
    outcome = await execute(spec)
    assert outcome.status is Outcome.TIMED_OUT
    assert outcome.limit == "idle_timeout"
    assert outcome.reason == "no output for 0.3s (idle_timeout)"
    assert outcome.excerpt == "started\n"


async def test_idle_timeout_spares_a_process_that_keeps_printing(tmp_path: Path) -> None:
    # 1.2 s of work, never more than 0.05 s without a byte (alternating
    # streams: stderr counts as output too).
    code = (
        "import sys, time\n"
        "for i in range(24):\n"
        "    stream = sys.stdout if i % 2 else sys.stderr\n"
        "    stream.write(f'tick {i}\\n'); stream.flush(); time.sleep(0.05)\n"
    )
    spec = make_spec(tmp_path, argv=script(code), idle_timeout=0.4)
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.limit is None
    assert "tick 23" in outcome.excerpt


async def test_a_process_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ignoring SIGTERM', flush=True); time.sleep(30)"
    )
    spec = make_spec(tmp_path, argv=script(code), timeout=0.5, kill_grace=0.3)
    started = time.monotonic()
    outcome = await execute(spec)
    assert outcome.status is Outcome.TIMED_OUT
    assert outcome.exit_code == -9
    assert time.monotonic() - started < 3


async def test_run_cancel_stops_the_group_and_returns_cancelled(
    tmp_path: Path, exit_watch: str
) -> None:
    spec = make_spec(tmp_path, argv=demo("--delay", "30", "--spawn-grandchild"))
    cancel = RunCancel()
    outcomes: list[ProcessOutcome] = []
    async with trio.open_nursery() as nursery:
        pid = await nursery.start(run_into, outcomes, spec, cancel)
        grandchild = await wait_for_grandchild(spec.log_path)
        cancel.cancel("cancelled through the API")
        cancel.cancel("a second call changes nothing")
    [outcome] = outcomes
    assert outcome.status is Outcome.CANCELLED
    assert outcome.reason == "cancelled through the API"
    assert outcome.limit is None
    assert outcome.exit_code == -15
    assert is_gone(pid)
    assert wait_gone(grandchild)


async def test_run_cancel_before_execute_spawns_nothing(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    cancel = RunCancel()
    cancel.cancel("shutting down")
    outcome = await execute(spec, cancel=cancel)
    assert outcome.status is Outcome.CANCELLED
    assert outcome.reason == "shutting down"
    assert outcome.exit_code is None
    assert not spec.log_path.exists()


async def test_cancelling_the_callers_scope_stops_the_group_and_reraises(
    tmp_path: Path, exit_watch: str
) -> None:
    spec = make_spec(tmp_path, argv=demo("--delay", "30", "--spawn-grandchild"))
    outcomes: list[ProcessOutcome] = []
    reraised = False
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            pid = await nursery.start(run_into, outcomes, spec)
            grandchild = await wait_for_grandchild(spec.log_path)
            scope.cancel()
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                reraised = True
                raise
    assert scope.cancelled_caught
    assert reraised
    assert outcomes == []  # execute raised Cancelled instead of returning
    # The cleanup ran to the end although the caller was being cancelled.
    assert is_gone(pid)
    assert wait_gone(grandchild)


async def test_cancelled_execute_raises_cancelled_itself(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, argv=demo("--delay", "30"))
    raised = False
    with trio.move_on_after(0.3) as scope:
        try:
            await execute(spec)
        except trio.Cancelled:
            raised = True
            raise
        pytest.fail("execute returned although its caller was cancelled")
    assert scope.cancelled_caught
    assert raised


async def test_a_grandchild_holding_the_pipes_does_not_keep_the_run_alive(
    tmp_path: Path, exit_watch: str
) -> None:
    spec = make_spec(tmp_path, argv=demo("--delay", "0", "--spawn-grandchild"))
    started = time.monotonic()
    outcome = await execute(spec)
    assert time.monotonic() - started < 3
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.result == "demo reply: say hello\n"
    grandchild = grandchild_pid(spec.log_path)
    assert grandchild is not None
    assert wait_gone(grandchild)
