"""What the API answers when the run ledger fails: each error says what is true of it.

A plain :class:`StoreError` (a locked or full disk) changed nothing and may
pass; a lost connection that reaches the API is one the store could not make
again just now (it tries again at the next request, after a pause while that
keeps failing); a commit whose answer was lost may have recorded the change.
"""

from __future__ import annotations

import logging

from herdsman.runtime.ledger import LedgerClosed
from herdsman.runtime.store import StoreError
from herdsman.runtime.store.errors import CommitOutcomeUnknown, ConnectionLost

log = logging.getLogger("herdsman.api")

RECONNECT = (
    "herdsman connects to its ledger again at a later request (pausing up to 30 s"
    " between attempts while the server cannot be reached)"
)


def unavailable(exc: StoreError) -> str:
    """The 503 message of a request other than a submit that the ledger failed."""
    log.warning("the run ledger failed: %s", exc)
    if isinstance(exc, ConnectionLost):
        # A commit's lost answer says itself that the change may have been kept.
        return f"the run ledger failed ({exc}); {RECONNECT}: ask again"
    # Unavailable, not broken: nothing was changed, and the same request
    # may succeed once the ledger is back.
    return f"the run ledger failed ({exc}); nothing changed: ask again"


def not_recorded(ids: list[str], exc: StoreError, *, batch: bool) -> dict[str, object]:
    """The 503 body of a submit the ledger refused: what to submit again, and why that is safe.

    A client that gave no id learns the one its run was given, so a retry
    cannot record the run twice should the first attempt have been kept.
    """
    if isinstance(exc, LedgerClosed):
        return _refused_while_stopping(ids, exc, batch=batch)
    log.warning("the run ledger failed to record a submit: %s", exc)
    if batch:
        what = "the batch may be recorded in part"
        again = 'submit it again with the same ids (in "ids")'
        which = "one"
    else:
        what = f"run {ids[0]} {_kept(exc)}"
        again = f'submit it again with the same id, "{ids[0]}"'
        which = "it"
    if isinstance(exc, ConnectionLost):
        again = f"{RECONNECT}: {again}"
    message = (
        f"{what}: the run ledger failed ({exc}); {again}: a known id returns the"
        f" existing run, so a retry never queues {which} twice"
    )
    return {"error": message, "ids": ids}


def _refused_while_stopping(ids: list[str], exc: LedgerClosed, *, batch: bool) -> dict[str, object]:
    """The 503 body of a submit that met the ledger closed: nothing kept, nothing to retry yet.

    Asking again at once meets the same closed ledger (or a server that is
    gone): the client must wait until the supervisor runs again.
    """
    if batch:
        what, again, which = (
            "the batch was not recorded",
            'them again with the same ids (in "ids")',
            "one",
        )
    else:
        what, again, which = (
            f"run {ids[0]} was not recorded",
            f'it again with the same id, "{ids[0]}"',
            "it",
        )
    message = (
        f"{what}: {exc}, and accepts no runs until it is started again (by you, or by"
        f" whatever restarts it); then submit {again}: a known id returns the existing"
        f" run, so a retry never queues {which} twice"
    )
    return {"error": message, "ids": ids}


def _kept(exc: StoreError) -> str:
    """What a single run's refused submit did to the ledger."""
    if isinstance(exc, CommitOutcomeUnknown):
        return "may have been recorded"
    if isinstance(exc, ConnectionLost):
        # An earlier request's lost commit may have recorded it: this one cannot tell.
        return "was not recorded by this request"
    return "was not recorded"
