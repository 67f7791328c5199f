"""Cheap reads of the current trio task's state, through trio's private names.

The simulator's replay records every run's finish on the inline ledger, and
what trio's public API offers for the two questions it asks there cost more
than the rest of the finish's bookkeeping: ``trio.current_effective_deadline()``
walks every enclosing cancel scope and reads each one's deadline property
(about 22,000 instructions a run), and ``trio.testing.assert_no_checkpoints()``
is a generator-based context manager (about 12,000). Both answers are single
attributes of the task, which these functions read. They are private names:
trio is pinned to one minor version (pyproject.toml) and
``tests/unit/platform/test_trio_canary.py`` checks, with hypothesis, that they
give what the public API gives.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

import trio

__all__ = ["checkpoints", "effectively_cancelled"]

#: Whether a blocking call in the task given would raise ``Cancelled`` now.
#:
#: What ``trio.current_effective_deadline() == -math.inf`` tells, from
#: inside the task, when no scope's deadline is set to ``-inf`` after the
#: scope was entered (herdsman sets none so). An ``attrgetter`` (C, no
#: Python frame), as is :data:`checkpoints`: the replay asks once a run.
effectively_cancelled: Callable[[trio.lowlevel.Task], bool] = attrgetter(
    "_cancel_status.effectively_cancelled"
)

#: The task's counts of cancel points and schedule points so far.
#:
#: They change exactly when the task passes a checkpoint: what
#: ``trio.testing.assert_no_checkpoints`` compares before and after its block.
checkpoints: Callable[[trio.lowlevel.Task], tuple[int, int]] = attrgetter(
    "_cancel_points", "_schedule_points"
)
