"""What the supervisor's intake refuses with, and how the supervisor stopped."""

from __future__ import annotations

import attrs

from herdsman.runtime.store import StoreError

__all__ = [
    "CancelNotRecorded",
    "NotAdmitting",
    "RunConflict",
    "RunNotFound",
    "ShutdownReport",
    "UnknownAccount",
]


class NotAdmitting(Exception):
    """The supervisor is shutting down and takes no new runs."""


class RunNotFound(Exception):
    """No run has this id."""


class UnknownAccount(Exception):
    """No configured account has this provider and name."""


class RunConflict(Exception):
    """The run is in a state that does not allow the request."""


class CancelNotRecorded(StoreError):
    """The ledger failed to record a cancel: the run is still queued, and may be cancelled again."""


@attrs.frozen
class ShutdownReport:
    """How the supervisor stopped."""

    drained: bool
    cancelled: tuple[str, ...]
    #: Why the supervisor stopped by itself (the ledger failed), if it did.
    fatal: str | None = None
