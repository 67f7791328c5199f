"""The errors every store raises, identical across implementations."""

from __future__ import annotations


class StoreError(Exception):
    """Anything the store refuses: a closed store, an unreadable file, bad input."""


class StoreConflict(StoreError):
    """A state change that is illegal from the run's current status.

    Raised, with nothing changed, when a caller asks for a transition the run
    lifecycle does not allow (see ``docs/store.md``) — including the loser of
    two writers racing for the same run.
    """


class RunNotFound(StoreError):
    """A state change named a run id the store does not hold."""


class LeaseExpired(StoreError):
    """This fleet member's lease lapsed (or it was expired): it may claim nothing more.

    A member that sees this has been, or is about to be, declared gone: its
    running runs are (or will be) ``lost``. It must stop admitting and say so.
    """
