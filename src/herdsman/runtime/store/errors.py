"""The errors every store raises, identical across implementations."""

from __future__ import annotations


class StoreError(Exception):
    """Anything the store refuses: a closed store, an unreadable file, bad input."""


class ConnectionLost(StoreError):
    """The store's connection to its database server is gone (PostgreSQL).

    Nothing of the call was recorded (unless it is a
    :class:`CommitOutcomeUnknown`). The store connects again at a later call:
    at the next one, then, while the server stays unreachable, after pauses
    growing to 30 s (see ``docs/store.md``), so asking again may succeed.
    """


class CommitOutcomeUnknown(ConnectionLost):
    """The connection was lost after COMMIT was sent, before the server answered.

    The server may have committed the transaction or not: the caller must
    read the outcome again (once reconnected) rather than assume either.
    """


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


def nested_apply() -> RuntimeError:
    """The error of ``Store.apply`` called from inside an operation of a batch.

    A programming error, not a store failure (so not a :class:`StoreError`):
    a batch is one transaction, which a nested batch would end early, or
    commit apart from the operation around it. Raised in that operation,
    which is then undone whole; the rest of the batch goes on.
    """
    return RuntimeError(
        "store.apply was called inside an operation of a batch: an operation calls"
        " the store's methods directly; only the ledger applies batches"
    )


class LedgerNotCurrent(StoreError):
    """A store opened without upgrading found a ledger at another schema version.

    A reading command (``herdsman usage``) opens the ledger this way: upgrading
    it would change the file or database under the supervisor that writes it,
    which may be an older herdsman that cannot read the new schema.
    ``version`` is the ledger's (0: no herdsman ledger was ever made there).
    """

    def __init__(self, where: str, version: int, current: int) -> None:
        self.version = version
        if version == 0:
            message = f"the run ledger {where} holds no runs yet: no supervisor has used it"
        else:
            message = (
                f"the run ledger {where} has schema version {version}, older than this"
                f" herdsman reads ({current}); reading it would upgrade it under the"
                " supervisor that writes it: restart that supervisor with this herdsman"
                " (it upgrades the ledger), or use the herdsman it runs"
            )
        super().__init__(message)
