"""The link faults: an agent's swapped checkout and a planted conversation folder.

With the supervisor as it is, neither touches anything outside the state
dir; with the ownership check taken out of the sweep, or links followed
when a conversation's folder is made, the fuzzer's invariant catches it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_fuzz_faults import CONFIG, _submit

from herdsman.runtime.worktrees import manager, sweeper
from herdsman.runtime.worktrees.manager import WorktreeManager
from herdsman.sim.fuzz.harness import Verdict, run_scenario
from herdsman.sim.fuzz.scenario import Scenario, ScenarioError, draw_scenario, scenario_from_json

SWAP = (
    _submit(0.0, "r1", "c1"),
    # After r1 ended, before the sweep at 60 s: its checkout becomes a link
    # to the user's own worktree.
    {"t": 40.0, "kind": "swap_checkout", "workspace": "default", "conversation": "c1",
     "repo": "repo0"},
    _submit(100.0, "r2", "c1"),  # the conversation comes back to its swapped checkout
    _submit(200.0, "r3", "c2"),
)  # fmt: skip
PLANT = (
    {"t": 0.0, "kind": "plant_link", "workspace": "default", "conversation": "c1"},
    _submit(1.0, "r1", "c1", dirty=True),
    _submit(100.0, "r2", "c1", dirty=True),
)


def _run(events: tuple[dict[str, Any], ...]) -> Verdict:
    return run_scenario(Scenario(7, CONFIG, events))


def test_a_checkout_swapped_for_the_users_worktree_touches_nothing_outside() -> None:
    verdict = _run(SWAP)
    assert verdict.violations == ()
    assert verdict.faults == 1


def test_the_fault_catches_a_sweep_that_follows_the_link(monkeypatch: pytest.MonkeyPatch) -> None:
    async def trusting(self: WorktreeManager, *args: object) -> None:
        return None

    monkeypatch.setattr(WorktreeManager, "check_owned", trusting)
    monkeypatch.setattr(sweeper, "refuse_links", lambda anchor, path: None)
    [violation] = _run(SWAP).violations
    assert violation.kind == "outside touched"
    assert violation.message.startswith("/herdsman-sim/user/repo0")


def test_a_link_planted_at_a_conversations_folder_touches_nothing_outside() -> None:
    verdict = _run(PLANT)
    assert verdict.violations == ()
    assert verdict.faults == 1


def test_the_fault_catches_a_run_that_follows_the_link(monkeypatch: pytest.MonkeyPatch) -> None:
    def following(_anchor: Path, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(manager, "make_private_dirs", following)
    monkeypatch.setattr(manager, "refuse_links", lambda anchor, path: None)
    [violation] = _run(PLANT).violations
    assert violation.kind == "outside touched"
    assert violation.message.startswith("/herdsman-sim/outside/c1-")


def test_seeds_draw_both_link_faults_and_a_case_file_names_a_bad_one() -> None:
    kinds = {e["kind"] for seed in range(40) for e in draw_scenario(seed).events}
    assert {"swap_checkout", "plant_link"} <= kinds
    data = {**draw_scenario(3).as_json(), "events": [{"t": 0, "kind": "swap_checkout"}]}
    with pytest.raises(ScenarioError, match=r"fuzz\.events\[0\]\.workspace: expected a name"):
        scenario_from_json(data, "case.jsonl")
