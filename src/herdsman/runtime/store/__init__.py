"""The run ledger: every run, its status and its outcome (see docs/store.md)."""

from herdsman.runtime.store.base import Store
from herdsman.runtime.store.errors import RunNotFound, StoreConflict, StoreError
from herdsman.runtime.store.memory import MemoryStore
from herdsman.runtime.store.records import (
    FINISH_STATUSES,
    JSON,
    LEGAL_TRANSITIONS,
    LOST_ON_RESTART,
    TERMINAL_STATUSES,
    AccountLimit,
    AccountUse,
    Attempt,
    NewRun,
    RunEnd,
    RunRecord,
    RunStatus,
    Session,
    Spend,
    is_terminal,
)
from herdsman.runtime.store.sqlite import SCHEMA_VERSION, SqliteStore
from herdsman.runtime.store.usage import UsageBy, UsageTotal

__all__ = [
    "FINISH_STATUSES",
    "JSON",
    "LEGAL_TRANSITIONS",
    "LOST_ON_RESTART",
    "SCHEMA_VERSION",
    "TERMINAL_STATUSES",
    "AccountLimit",
    "AccountUse",
    "Attempt",
    "MemoryStore",
    "NewRun",
    "RunEnd",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "Session",
    "Spend",
    "SqliteStore",
    "Store",
    "StoreConflict",
    "StoreError",
    "UsageBy",
    "UsageTotal",
    "is_terminal",
]
