"""What a batch's summary counts: faults that took effect, drawn where they can.

A git failure waits for the next call of its operation: in a scenario
without repositories no call ever comes, so none is drawn there; and one
no call met (the run it would have hit was over) is not counted as a fault.
"""

from __future__ import annotations

import pytest

from herdsman.sim.fuzz.campaign import fuzz_seeds
from herdsman.sim.fuzz.scenario import draw_scenario

pytestmark = pytest.mark.usefixtures("quiet_herdsman")


def test_no_git_failure_is_drawn_without_a_repository() -> None:
    without = [draw_scenario(seed) for seed in range(120)]
    without = [s for s in without if "[[repos]]" not in s.config]
    assert len(without) > 20
    for scenario in without:
        kinds = [event["kind"] for event in scenario.events]
        assert "git_failure" not in kinds, scenario.seed


def test_the_summary_counts_the_faults_that_took_effect() -> None:
    # Seed 12 has a repository and draws seven faults (a shutdown among
    # them); its one git failure (of head) is never met: six took effect.
    scenario = draw_scenario(12)
    assert "[[repos]]" in scenario.config
    assert len(scenario.events) - scenario.run_count == 7
    assert [e["kind"] for e in scenario.events].count("git_failure") == 1
    batch = fuzz_seeds([12])
    assert batch.failure is None
    assert batch.faults == 6
    # Seed 0's git failure is met: all six of its faults count.
    assert fuzz_seeds([0]).faults == 6
