"""The fuzzer's follow-up sent during a sweep's removal, and its check of ``removal_wait``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from herdsman.runtime.worktrees.manager import WorktreeManager
from herdsman.runtime.worktrees.slug import conversation_slug
from herdsman.sim.fuzz.harness import run_scenario
from herdsman.sim.fuzz.removal_waits import RemovalWaits
from herdsman.sim.fuzz.scenario import ScenarioError, draw_scenario, scenario_from_json

#: A seed whose follow-up goes out during a removal (found by running seeds 0-59).
SEED = 14


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.CRITICAL)


def folder(conversation: str) -> Path:
    return Path("/s/worktrees") / conversation_slug("default", conversation) / "repo0"


def test_a_wait_with_a_removal_under_way_and_recorded_after_it_passes() -> None:
    failures: list[tuple[str, str]] = []
    waits = RemovalWaits(lambda kind, message: failures.append((kind, message)))
    waits.began(folder("c"))
    waits.wait({"id": "r1", "conversation": "c"})
    waits.ended(folder("c"))
    waits.submitted("r1")
    waits.submitted("r2")  # never waited
    assert failures == []


def test_a_wait_with_no_removal_under_way_is_a_violation() -> None:
    failures: list[tuple[str, str]] = []
    waits = RemovalWaits(lambda kind, message: failures.append((kind, message)))
    waits.began(folder("other"))
    waits.wait({"id": "r1", "conversation": "c"})
    assert failures == [
        (
            "removal wait",
            "r1 was traced waiting for a removal of c's worktrees, and none was under way",
        )
    ]


def test_a_run_recorded_while_its_removal_goes_on_is_a_violation() -> None:
    failures: list[tuple[str, str]] = []
    waits = RemovalWaits(lambda kind, message: failures.append((kind, message)))
    waits.began(folder("c"))
    waits.wait({"id": "r1", "conversation": "c"})
    waits.submitted("r1")
    assert [kind for kind, _ in failures] == ["removal wait"]
    assert "still under way" in failures[0][1]


def test_a_follow_up_sent_during_a_removal_waits_for_it_and_breaks_nothing() -> None:
    scenario = draw_scenario(SEED)
    marked = [e for e in scenario.events if e.get("on_removal")]
    assert len(marked) == 1
    assert scenario.git_latency > 0
    verdict = run_scenario(scenario)
    assert verdict.violations == ()
    waits = [
        json.loads(line)
        for trace in verdict.traces
        for line in trace.splitlines()
        if '"removal_wait"' in line
    ]
    assert [w["run_id"] for w in waits] == [marked[0]["run"]["id"]]


def test_a_supervisor_that_traces_waits_it_never_made_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planted: every submit to a conversation thinks a removal is under way.
    monkeypatch.setattr(WorktreeManager, "removal_under_way", lambda *_: True)
    verdict = run_scenario(draw_scenario(SEED))
    assert "removal wait" in [v.kind for v in verdict.violations]


def test_a_case_file_s_on_removal_is_true_or_false() -> None:
    scenario = draw_scenario(SEED)
    data = {
        "version": 1,
        "seed": SEED,
        "config": scenario.config,
        "events": [
            {**e, "on_removal": "yes"} if e.get("on_removal") else e for e in scenario.events
        ],
    }
    with pytest.raises(ScenarioError, match=r"\.on_removal: expected true or false"):
        scenario_from_json(data, "case.jsonl")
