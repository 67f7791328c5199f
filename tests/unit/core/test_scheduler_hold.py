"""``Scheduler.hold``: a started run that keeps its lanes but gives back its slot.

A fleet member holds a run whose claim was refused (docs/fleet.md); these
pin each part of the rule on examples. The state machine in
``test_scheduler_properties.py`` mixes ``hold`` into random histories.
"""

from __future__ import annotations

import pytest

from herdsman.core import CancelOutcome, Limits, RunRequest, RunState, Scheduler, SchedulerError


def ids(runs: list[RunRequest]) -> list[str]:
    return [r.id for r in runs]


def one_slot_with_a_held_run() -> Scheduler:
    """Cap 1: "held" (conversation c) started and was held; "behind" waits on c."""
    s = Scheduler(Limits({"p": 1}, global_cap=1))
    s.submit(RunRequest("held", "p", conversation="c"))
    s.submit(RunRequest("behind", "p", conversation="c"))
    assert ids(s.take_startable()) == ["held"]
    s.hold("held")
    return s


def test_a_held_run_gives_back_its_slot_so_a_run_on_a_free_lane_starts_at_once() -> None:
    s = one_slot_with_a_held_run()
    assert s.has_free_slot("p")
    s.submit(RunRequest("free", "p", conversation="other"))
    assert ids(s.take_startable()) == ["free"]


def test_a_held_run_keeps_its_lanes_and_is_not_offered_again() -> None:
    s = one_slot_with_a_held_run()
    assert s.take_startable() == []  # "behind" waits on c, "held" is not offered
    assert s.state_of("held") is RunState.HELD
    assert s.state_of("behind") is RunState.QUEUED
    assert s.is_busy(RunRequest("skip?", "p", conversation="c"))


def test_requeue_puts_a_held_run_back_ahead_of_the_runs_behind_it() -> None:
    s = one_slot_with_a_held_run()
    s.requeue("held")
    first = ids(s.take_startable())
    s.finish("held")
    assert (first, ids(s.take_startable())) == (["held"], ["behind"])


def test_cancelling_a_held_run_withdraws_it_and_frees_its_lanes() -> None:
    s = one_slot_with_a_held_run()
    assert s.cancel("held") is CancelOutcome.REMOVED
    assert s.state_of("held") is None
    assert ids(s.take_startable()) == ["behind"]


def test_counts_report_held_runs_as_neither_running_nor_queued() -> None:
    s = one_slot_with_a_held_run()
    assert (s.running_count, s.queued_count, s.held_count) == (0, 1, 1)
    snap = s.snapshot()
    assert (snap.running, snap.queued, snap.held) == (0, 1, 1)
    assert dict(snap.held_by_provider) == {"p": 1}
    assert dict(snap.running_by_provider) == {}
    assert ids(list(s.held_runs())) == ["held"]
    assert list(s.running_runs()) == []


def test_only_a_running_run_can_be_held_or_finished() -> None:
    s = one_slot_with_a_held_run()
    for call, run_id in [
        (s.hold, "held"),  # already held
        (s.finish, "held"),  # no process: put it back or cancel it
        (s.hold, "behind"),  # queued
        (s.hold, "never"),
    ]:
        with pytest.raises(SchedulerError):
            call(run_id)
    assert s.state_of("held") is RunState.HELD


def test_a_held_run_keeps_its_lanes_across_an_exclusivity_switch() -> None:
    s = Scheduler(Limits({"p": 2}), agent_exclusive=False)
    s.submit(RunRequest("held", "p", conversation="c0", agent="a"))
    assert ids(s.take_startable()) == ["held"]
    s.hold("held")
    s.set_agent_exclusive(True)
    s.submit(RunRequest("same-agent", "p", conversation="c1", agent="a"))
    s.submit(RunRequest("same-conversation", "p", conversation="c0"))
    assert s.take_startable() == []
    s.requeue("held")
    assert ids(s.take_startable()) == ["held"]
