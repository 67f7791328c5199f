"""A snapshot costs the lanes it lists, never a walk of the queue.

Cost is counted, not timed (line_cost.py): the lines of the scheduler's
module one :meth:`Scheduler.snapshot` executes.
"""

from __future__ import annotations

from line_cost import lines_run

import herdsman.core.scheduler as scheduler_module
from herdsman.core import Limits, RunRequest, Scheduler, SchedulerSnapshot


def lines_run_by(sched: Scheduler) -> tuple[int, SchedulerSnapshot]:
    """How many lines of scheduler.py one snapshot executes, and the snapshot."""
    return lines_run((scheduler_module,), sched.snapshot)


def queue_in_conversations(queued: int, *, lone: int = 0) -> Scheduler:
    """Two running, ``queued`` waiting on 3 conversations, ``lone`` runs without any."""
    sched = Scheduler(Limits({"p": 2}))
    for n in range(queued + 2):
        sched.submit(RunRequest(f"r{n}", "p", conversation=f"c{n % 3}"))
    for n in range(lone):
        sched.submit(RunRequest(f"lone{n}", "q"))  # q has no slots: they stay queued
    sched.take_startable()
    return sched


def test_a_snapshot_does_not_walk_the_runs_queued_on_lanes() -> None:
    small, large = queue_in_conversations(10), queue_in_conversations(2_000)
    small_lines, _ = lines_run_by(small)
    large_lines, large_snap = lines_run_by(large)
    assert large_snap.queued == 2_000
    assert dict(large_snap.queued_by_lane) == {
        "conversation:default/c0": 667,
        "conversation:default/c1": 666,
        "conversation:default/c2": 667,
    }
    assert large_lines == small_lines


def test_a_snapshot_costs_one_step_per_lone_run_listed_and_no_more() -> None:
    # Each lone run is a lane in the listing; the runs on lanes beside them
    # still cost nothing.
    base_lines, _ = lines_run_by(queue_in_conversations(10, lone=5))
    more_lines, snap = lines_run_by(queue_in_conversations(2_000, lone=5))
    assert [k for k in snap.queued_by_lane if k.startswith("run:")] == [
        f"run:default/lone{n}" for n in range(5)
    ]
    assert more_lines == base_lines
