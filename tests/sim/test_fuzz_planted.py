"""The fuzzer can fail: bugs planted in the supervisor are found, minimised and reproduced.

Each test plants one bug (a monkeypatch), runs ``herdsman sim fuzz`` over
seeds until one breaks an invariant, and checks what a developer gets: the
violation, the one-line command that reproduces it, and a minimised case
file that ``herdsman sim replay`` runs to the same violation — and that
passes once the bug is gone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import attrs
import pytest

import herdsman.runtime.requests as requests_module
from herdsman.cli import main
from herdsman.runtime.store.memory import MemoryStore
from herdsman.runtime.supervisor import Supervisor
from herdsman.runtime.worktrees import sweeper
from herdsman.sim.fuzz.scenario import draw_scenario

SEEDS = "40"


def _fuzz_finds(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> Path:
    """Run the batch; check the report names ``kind``, a reproduction and a smaller case."""
    case = tmp_path / "case.jsonl"
    code = main(["sim", "fuzz", "--seeds", SEEDS, "--out", str(case)])
    out = capsys.readouterr().out
    assert code == 1, out
    lines = out.splitlines()
    assert f": {kind}: " in lines[1]
    seed = int(lines[0].split()[1])
    assert lines[2] == f"reproduce: herdsman sim fuzz --seeds 1 --seed {seed}"
    assert lines[3].startswith("minimised to ")
    kept, whole = int(lines[3].split()[2]), int(lines[3].split()[4])
    assert kept < whole == len(draw_scenario(seed).events)
    assert f": {kind}: " in lines[4]
    header = json.loads(case.read_text())
    assert len(header["fuzz"]["events"]) == kept
    assert header["fuzz"]["seed"] == seed
    # The reproduction line gives the same first violation.
    assert main(["sim", "fuzz", "--seeds", "1", "--seed", str(seed), "--budget", "0",
                 "--out", str(tmp_path / "again.jsonl")]) == 1  # fmt: skip
    assert capsys.readouterr().out.splitlines()[1] == lines[1]
    return case


def _replays(case: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["sim", "replay", str(case), "--out", str(case.with_suffix(".out"))])
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_a_sweeper_that_removes_a_dirty_worktree_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    honest = sweeper._sweep_folder

    async def careless(*args: Any, **kwargs: Any) -> list[sweeper.SweptWorktree]:
        entries = await honest(*args, **kwargs)
        if any(entry.action == "kept-dirty" for entry in entries):
            shutil.rmtree(entries[0].path.parent)  # "clean up" the whole folder anyway
        return entries

    monkeypatch.setattr(sweeper, "_sweep_folder", careless)
    case = _fuzz_finds(tmp_path, capsys, "dirty worktree removed")
    code, err = _replays(case, capsys)
    assert code == 1
    assert ": dirty worktree removed: " in err
    monkeypatch.undo()
    code, err = _replays(case, capsys)
    assert code == 0
    assert err.endswith("every invariant held\n")


def test_a_sweep_of_a_busy_conversation_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Supervisor, "conversation_busy", lambda self, w, c: False)
    case = _fuzz_finds(tmp_path, capsys, "busy worktree removed")
    code, err = _replays(case, capsys)
    assert code == 1
    assert ": busy worktree removed: " in err


@pytest.mark.slow
def test_a_restart_that_requeues_out_of_order_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    in_order = MemoryStore.queued_in_order
    monkeypatch.setattr(MemoryStore, "queued_in_order", lambda self: in_order(self)[::-1])
    case = _fuzz_finds(tmp_path, capsys, "restart order")
    code, err = _replays(case, capsys)
    assert code == 1
    assert ": restart order: " in err
    events = json.loads(case.read_text())["fuzz"]["events"]
    kinds = [e["kind"] for e in events]
    assert kinds.count("crash") + kinds.count("shutdown") == 1  # one restart


def test_a_cap_off_by_one_is_caught(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from herdsman.runtime.requests import limits_of  # what the supervisor's settings hold

    def one_more(config: Any) -> Any:
        limits = limits_of(config)
        caps = {name: cap + 1 for name, cap in limits.provider_caps.items()}
        return attrs.evolve(limits, provider_caps=caps)

    monkeypatch.setattr(requests_module, "limits_of", one_more)
    case = _fuzz_finds(tmp_path, capsys, "cap")
    code, err = _replays(case, capsys)
    assert code == 1
    assert ": cap: " in err
