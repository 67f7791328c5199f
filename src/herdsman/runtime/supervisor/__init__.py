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
from herdsman.runtime.supervisor.execution import Execute
from herdsman.runtime.supervisor.facade import Supervisor
from herdsman.runtime.supervisor.intake import SKIP_REASON, OnBusy
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
