"""``Scheduler.has_ready``: when it says no run is free of its lanes, nothing may start."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from herdsman.core import Limits, RunRequest, Scheduler


def test_a_follow_up_behind_its_running_turn_is_not_ready_until_the_turn_ends() -> None:
    scheduler = Scheduler(Limits({"claude": 4}))
    assert not scheduler.has_ready()  # nothing queued
    scheduler.submit(RunRequest("r1", "claude", "c1"))
    assert scheduler.has_ready()
    assert [run.id for run in scheduler.take_startable()] == ["r1"]
    scheduler.submit(RunRequest("r2", "claude", "c1"))  # the same conversation
    assert not scheduler.has_ready()
    scheduler.finish("r1")
    assert scheduler.has_ready()
    assert [run.id for run in scheduler.take_startable()] == ["r2"]


def test_a_run_held_back_only_by_its_slots_is_ready() -> None:
    scheduler = Scheduler(Limits({"claude": 1}))
    scheduler.submit(RunRequest("r1", "claude"))
    scheduler.submit(RunRequest("r2", "claude"))
    scheduler.take_startable()
    assert scheduler.has_ready()  # r2 waits for a slot, not for a lane


# Steps: submit a run on one of a few conversations (or none), finish the
# running run at some position, or cancel the queued run at some position.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.sampled_from([None, "c1", "c2"])),
        st.tuples(st.just("finish"), st.integers(0, 20)),
        st.tuples(st.just("cancel"), st.integers(0, 20)),
    ),
    max_size=50,
)


@given(st.integers(1, 3), steps)
def test_when_no_run_is_ready_take_startable_starts_nothing(
    slots: int, plan: list[tuple[str, object]]
) -> None:
    scheduler = Scheduler(Limits({"claude": slots}))
    for number, (kind, arg) in enumerate(plan):
        if kind == "submit":
            assert arg is None or isinstance(arg, str)
            scheduler.submit(RunRequest(f"r{number}", "claude", arg))
        elif kind == "finish":
            running = list(scheduler.running_runs())
            if running:
                assert isinstance(arg, int)
                scheduler.finish(running[arg % len(running)].id)
        else:
            queued = list(scheduler.queued_runs())
            if queued:
                assert isinstance(arg, int)
                scheduler.cancel(queued[arg % len(queued)].id)
        ready = scheduler.has_ready()
        started = scheduler.take_startable()
        if not ready:
            assert started == []
        # Whatever is left queued waits for a slot or a lane: ready only if a slot is full.
        if scheduler.has_ready():
            assert scheduler.running_count == slots
