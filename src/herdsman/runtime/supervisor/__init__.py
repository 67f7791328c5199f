"""The supervisor: a facade over the tasks that take runs in, start them, and see them end.

``from herdsman.runtime.supervisor import Supervisor`` is the way in; the
modules of this package are its parts (docs/architecture.md shows them).
"""

from herdsman.runtime.supervisor.errors import (
    CancelNotRecorded,
    NotAdmitting,
    RunConflict,
    RunNotFound,
    ShutdownReport,
    UnknownAccount,
)
from herdsman.runtime.supervisor.facade import SKIP_REASON, Execute, OnBusy, Supervisor
from herdsman.runtime.supervisor.outcomes import as_text, finish_fields

__all__ = [
    "SKIP_REASON",
    "CancelNotRecorded",
    "Execute",
    "NotAdmitting",
    "OnBusy",
    "RunConflict",
    "RunNotFound",
    "ShutdownReport",
    "Supervisor",
    "UnknownAccount",
    "as_text",
    "finish_fields",
]
