"""Sans-IO decision cores: plain classes that take events and return decisions."""

from herdsman.core.key_claims import KeyClaims
from herdsman.core.runs import DEFAULT_WORKSPACE, RunRequest, busy_keys, exclusion_keys
from herdsman.core.scheduler import (
    CancelOutcome,
    Limits,
    RunState,
    Scheduler,
    SchedulerError,
    SchedulerSnapshot,
    StartGate,
)

__all__ = [
    "DEFAULT_WORKSPACE",
    "CancelOutcome",
    "KeyClaims",
    "Limits",
    "RunRequest",
    "RunState",
    "Scheduler",
    "SchedulerError",
    "SchedulerSnapshot",
    "StartGate",
    "busy_keys",
    "exclusion_keys",
]
