"""The fuzzer gives a verdict on a supervisor that hangs, and checks intake against what was sent.

Each test plants one bug (a monkeypatch) and runs a seed or two: a run
whose end never comes, a task stuck for ever in a shielded scope, an intake
that loses a run's conversation. Each must end in a violation — not in a
fuzzer that never returns — and, through the command, in a reproduction
line and a case file. A watchdog turns a hang into a failure.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from sim_workloads import within as _within

from herdsman.cli import main
from herdsman.runtime.store import NewRun
from herdsman.runtime.supervisor import Supervisor
from herdsman.runtime.supervisor.execution import Execution
from herdsman.sim.fuzz.harness import Verdict, run_scenario
from herdsman.sim.fuzz.scenario import draw_scenario

#: The fuzzer's own wall limit in these tests, below the watchdog's by more
#: than the 30 s the fuzzer may wait for a frozen run to park: a run
#: the watchdog gave up on would go on in its thread with pyfakefs's patch,
#: which is process-wide, and the next test's simulator would lose its fake
#: filesystem when that patch ended. The fuzzer freezes its own run instead.
WALL_LIMIT = 60.0


def _fuzz(seed: int) -> Verdict:
    logging.getLogger("herdsman").setLevel(logging.CRITICAL)
    return _within(120, lambda: run_scenario(draw_scenario(seed), wall_limit=WALL_LIMIT))


@pytest.mark.slow
def test_a_run_whose_end_never_comes_is_caught_at_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    honest = Execution._record_finish

    async def forgetful(self: Execution, record: Any, ended: Any, **options: Any) -> Any:
        if record.id == "r000":
            return None  # its end is dropped: it stays running, in ledger and scheduler alike
        return await honest(self, record, ended, **options)

    monkeypatch.setattr(Execution, "_record_finish", forgetful)
    verdict = _fuzz(89)
    assert verdict.failed
    first = verdict.violations[0]
    assert first.kind == "drain"
    assert "never finished at the bound after the last fault" in first.message
    assert "r000 (running)" in first.message


def _stick_r000(monkeypatch: pytest.MonkeyPatch) -> None:
    honest = Execution._record_finish

    async def deadlocked(self: Execution, record: Any, ended: Any, **options: Any) -> Any:
        if record.id == "r000":
            # Stuck for ever where a forced stop cannot reach it (the
            # supervisor shields a finish that waits for its ledger).
            with trio.CancelScope(shield=True):
                await trio.Event().wait()
        return await honest(self, record, ended, **options)

    monkeypatch.setattr(Execution, "_record_finish", deadlocked)


def test_a_supervisor_stuck_at_teardown_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    _stick_r000(monkeypatch)
    verdict = _fuzz(0)
    kinds = [v.kind for v in verdict.violations]
    assert kinds == ["drain", "supervisor did not stop"]
    assert "told to stop" in verdict.violations[1].message


@pytest.mark.slow
def test_a_supervisor_stuck_when_killed_gives_a_case_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _stick_r000(monkeypatch)
    verdict = _fuzz(5)  # a crash comes while r000 is ending
    assert [v.kind for v in verdict.violations] == ["supervisor did not stop"]
    assert "killed" in verdict.violations[0].message
    case = tmp_path / "case.jsonl"
    argv = ["sim", "fuzz", "--seeds", "1", "--seed", "5", "--out", str(case)]
    code = _within(200, lambda: main([*argv, "--wall-limit", "120"]))
    lines = capsys.readouterr().out.splitlines()
    assert code == 1, lines
    assert ": supervisor did not stop: " in lines[1]
    assert lines[2] == "reproduce: herdsman sim fuzz --seeds 1 --seed 5"
    assert json.loads(case.read_text())["fuzz"]["seed"] == 5


def test_an_intake_that_loses_a_conversation_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # submit_each: every submit goes through it (a single one without submit_many).
    honest = Supervisor.submit_each

    async def careless(self: Supervisor, items: Any) -> Any:
        out: list[tuple[NewRun, Any]] = []
        for new, on_busy in items:
            lost = new.conversation is not None and int(new.id[-1]) % 2
            out.append((attrs.evolve(new, conversation=None) if lost else new, on_busy))
        return await honest(self, out)

    monkeypatch.setattr(Supervisor, "submit_each", careless)
    verdict = _fuzz(0)
    assert verdict.failed
    first = verdict.violations[0]
    assert first.kind == "intake"
    assert first.message == "r001 was not recorded as sent: conversation 'c4' became None"
