"""``herdsman sim replay`` of a plain trace ends, with a finding, when the replay stops moving.

Each test plants one hang (a monkeypatch of the fake runner or the
supervisor) and replays a small recorded trace through the command: a run
that yields for ever without letting the clock move (a spin), a submit that
waits for something that never comes (a stall), a blocking call (the wall
limit). Each must end in one line naming what stopped moving, when, and the
event, with the command that reproduces it, and exit status 1 — not in a
replay that never returns: a watchdog turns a hang into a failure.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from sim_workloads import busy_trace
from sim_workloads import within as _within

from herdsman.cli import main
from herdsman.runtime.runner import ProcessOutcome, ProcessSpec
from herdsman.runtime.supervisor import Supervisor
from herdsman.sim.bounds import Stuck, run_watched
from herdsman.sim.fuzz.campaign import write_case
from herdsman.sim.fuzz.harness import Verdict
from herdsman.sim.fuzz.scenario import draw_scenario
from herdsman.sim.replay import Driver


def _replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str
) -> tuple[int, list[str], Path]:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=6)
    argv = ["sim", "replay", str(trace), "--out", str(tmp_path / "out.jsonl"), *flags]
    code = _within(120, lambda: main(argv))
    return code, capsys.readouterr().err.splitlines(), trace


def test_a_run_that_spins_is_a_spin_named_with_its_event_and_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def spinning(self: Driver, spec: ProcessSpec, **options: Any) -> ProcessOutcome:
        while True:  # yields for ever, never waits: the clock never moves
            await trio.lowlevel.checkpoint()

    monkeypatch.setattr(Driver, "execute", spinning)
    code, err, trace = _replay(tmp_path, capsys, "--seed", "3")
    assert code == 1
    assert len(err) == 1, err
    (line,) = err
    assert line.startswith("herdsman: the replay stopped making progress: spin: tasks kept running")
    assert "and the clock never moved" in line
    assert "the last event delivered: the submit of " in line
    assert line.endswith(f"; reproduce: herdsman sim replay {trace} --seed 3")
    assert "Traceback" not in line


def test_a_submit_that_never_returns_is_a_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def waiting(self: Supervisor, *args: Any, **kwargs: Any) -> Any:
        await trio.Event().wait()  # for something that never comes

    monkeypatch.setattr(Supervisor, "submit_each", waiting)
    code, err, trace = _replay(tmp_path, capsys, "--set", "providers.claude.concurrency=1")
    assert code == 1
    # The line before says the what-if leaves the trace's reload out.
    assert "Traceback" not in "\n".join(err)
    line = err[-1]
    assert line.startswith("herdsman: the replay stopped making progress: stall: every task waits")
    assert "is past the bound of 1200s" in line  # STOP_GRACE and the shutdown grace (600 s)
    assert "; the last event delivered: the submit of r000 at t=0.500; reproduce:" in line
    assert line.endswith(
        f"; reproduce: herdsman sim replay {trace} --set providers.claude.concurrency=1"
    )


def test_a_blocking_call_meets_the_wall_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def blocking(self: Driver, spec: ProcessSpec, **options: Any) -> ProcessOutcome:
        threading.Event().wait()  # blocks the replay's thread for ever: no round comes
        raise AssertionError("unreachable")

    monkeypatch.setattr(Driver, "execute", blocking)
    code, err, trace = _replay(tmp_path, capsys, "--wall-limit", "0.5")
    assert code == 1
    (line,) = err
    assert line.startswith(
        "herdsman: the replay stopped making progress: wall time: no end after 0.5s of wall time"
    )
    assert line.endswith(f"; reproduce: herdsman sim replay {trace} --wall-limit 0.5")


def test_a_spin_that_cannot_wind_down_is_left_asleep_with_its_finding() -> None:
    async def shielded_spin(clock: trio.testing.MockClock) -> int:
        with trio.CancelScope(shield=True):
            while True:
                await trio.lowlevel.checkpoint()
        raise AssertionError("a shielded spin ended")

    def replay() -> str:
        with pytest.raises(Stuck) as stuck:
            run_watched(shielded_spin, progress=lambda: 0, where=lambda: "nowhere")
        return str(stuck.value)

    message = _within(120, replay)
    assert message.startswith("spin: tasks kept running")
    assert message.endswith("; nowhere")


def test_a_wall_limit_that_is_not_seconds_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=2)
    with pytest.raises(SystemExit) as exit_:
        main(["sim", "replay", str(trace), "--wall-limit", "soon"])
    assert exit_.value.code == 2
    assert "--wall-limit: expected seconds > 0, got 'soon'" in capsys.readouterr().err


def test_a_wall_limit_for_the_fast_engine_is_refused_not_ignored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=2)
    assert main(["sim", "replay", str(trace), "--engine", "fast", "--wall-limit", "5"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith("leave --wall-limit out with --engine fast")


def test_a_fuzz_case_replays_under_the_given_wall_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    case = tmp_path / "case.jsonl"
    write_case(case, Verdict(draw_scenario(0), (), (), 0.0, 0.0))
    honest = Supervisor.submit_each

    async def blocking(self: Supervisor, items: Any) -> Any:
        time.sleep(2)  # holds the whole thread: nothing in simulated time can see it
        return await honest(self, items)

    monkeypatch.setattr(Supervisor, "submit_each", blocking)
    argv = ["sim", "replay", str(case), "--out", str(tmp_path / "out"), "--wall-limit", "0.5"]
    assert _within(120, lambda: main(argv)) == 1
    assert ": wall time: no verdict after 0.5s of wall time" in capsys.readouterr().err


def test_a_step_under_way_at_the_wall_limit_ends_on_the_fake_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # pyfakefs's patch is process-wide: had the replay left the fake
    # filesystem while this step was under way, the step would end on the
    # real one and leave the marker here.
    marker = tmp_path / "written-after-the-limit"
    case = tmp_path / "case.jsonl"
    write_case(case, Verdict(draw_scenario(0), (), (), 0.0, 0.0))
    honest = Supervisor.submit_each

    async def blocking(self: Supervisor, items: Any) -> Any:
        time.sleep(2)  # past the wall limit, inside one task step
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("a write the run began on the fake filesystem\n")
        return await honest(self, items)

    monkeypatch.setattr(Supervisor, "submit_each", blocking)
    argv = ["sim", "replay", str(case), "--out", str(tmp_path / "out"), "--wall-limit", "0.5"]
    assert _within(120, lambda: main(argv)) == 1
    assert ": wall time: no verdict after 0.5s of wall time" in capsys.readouterr().err
    time.sleep(2.5)  # long enough for the step to have ended, wherever it did
    assert not marker.exists()


def _worker_writing_after(delay: float, marker: Path, wrote: threading.Event) -> None:
    # In one of trio's worker threads: ends on its own, past the wall limit.
    time.sleep(delay)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("a write the run began on the fake filesystem\n")
    finally:
        wrote.set()


def test_a_worker_thread_at_work_at_the_wall_limit_ends_on_the_fake_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The fuzzer's run parks at its next task step, but a trio.to_thread
    # call under way goes on in a worker thread of its own: had the replay
    # left the fake filesystem before that thread ended, it would write here.
    marker = tmp_path / "written-by-a-worker-thread"
    wrote = threading.Event()
    case = tmp_path / "case.jsonl"
    write_case(case, Verdict(draw_scenario(0), (), (), 0.0, 0.0))
    honest = Supervisor.submit_each

    async def in_a_worker(self: Supervisor, items: Any) -> Any:
        await trio.to_thread.run_sync(_worker_writing_after, 2.0, marker, wrote)
        return await honest(self, items)

    monkeypatch.setattr(Supervisor, "submit_each", in_a_worker)
    argv = ["sim", "replay", str(case), "--out", str(tmp_path / "out"), "--wall-limit", "0.5"]
    assert _within(120, lambda: main(argv)) == 1
    assert ": wall time: no verdict after 0.5s of wall time" in capsys.readouterr().err
    assert wrote.wait(60)  # the worker's write is over, wherever it went
    assert not marker.exists()


def test_a_worker_thread_at_work_when_a_replay_is_stuck_ends_on_the_fake_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A replay whose run waits on a worker thread stalls (every task waits,
    # no timer helps) and cannot wind down (the call ignores the cancel):
    # it is left asleep at once, well before the worker ends.
    marker = tmp_path / "written-by-a-worker-thread"
    wrote = threading.Event()

    async def in_a_worker(self: Driver, spec: ProcessSpec, **options: Any) -> ProcessOutcome:
        await trio.to_thread.run_sync(_worker_writing_after, 2.0, marker, wrote)
        raise AssertionError("the replay was to be left asleep by now")

    monkeypatch.setattr(Driver, "execute", in_a_worker)
    code, err, _ = _replay(tmp_path, capsys)
    assert code == 1
    assert err[-1].startswith("herdsman: the replay stopped making progress: stall:"), err
    assert wrote.wait(60)
    assert not marker.exists()
