"""How a run ended, as one value: what every engine hands the lifecycle at a finish.

:class:`Outcome` is how the process ended (the runner's verdict),
:class:`UsageLimit` what a provider said about quota, :class:`RunOutcome`
both together with what the lifecycle needs to settle the run, and
:class:`RunStatus` where a run stands in the ledger, the final word a
finish records. They live in the core because the lifecycle decides with
them; the runner and the stores use the very same types.
"""

from __future__ import annotations

import enum

import attrs

from herdsman.core.account_usage import NO_CHARGE, Charge
from herdsman.core.retry import Failure

__all__ = ["AccountSignals", "Outcome", "RunOutcome", "RunStatus", "UsageLimit"]


class Outcome(enum.StrEnum):
    """How a run ended. The values equal the store's run statuses of the same name."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class RunStatus(enum.StrEnum):
    """Where a run is in its lifecycle. The values are what the store persists."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    LOST = "lost"
    SKIPPED = "skipped"
    USAGE_LIMITED = "usage_limited"


@attrs.frozen
class UsageLimit:
    """The provider said the account is out of quota.

    ``resets_at`` is when it said the quota comes back (unix seconds), if it said
    so in a form we could parse; ``message`` is what it said, for humans.
    """

    resets_at: float | None
    message: str


@attrs.frozen
class AccountSignals:
    """What an attempt's stream said about its account, beyond a usage limit.

    ``tokens`` and ``usd``: what it spent, as ``tokens`` and ``usd`` budgets
    count it (None: not stated). ``near_limit``: the provider warned that the
    account is near its limit (``allowed_warning``); ``near_limit_until`` is
    the warning's reset, if it named one. ``needs_login``: the attempt failed
    to authenticate, in the provider's words (None: it did not).
    """

    tokens: int | None = None
    usd: float | None = None
    near_limit: bool = False
    near_limit_until: float | None = None
    needs_login: str | None = None


def _charge_of(outcome: RunOutcome) -> Charge:
    signals = outcome.account
    if signals is None or (signals.tokens is None and signals.usd is None):
        return NO_CHARGE
    return Charge(signals.tokens, signals.usd)


@attrs.frozen
class RunOutcome:
    """How one attempt of a run ended, as the lifecycle settles it.

    ``exit_code`` None: no process was ever spawned (its program was missing,
    it was cancelled while preparing), so the attempt spent nothing of its
    account's budget. ``usage_limit``: the provider said the account is out
    of quota. ``session``: the run reported a resumable session, which lives
    under the account it ran on, so its conversation sticks to that account.
    ``failure``: the class of a failure a retry policy may try again (None:
    none such); ``worked``: the agent may have done some of its work before
    it ended (it called a tool or finished a turn), which only some classes
    retry. ``account``: what the attempt spent and said of its account (None:
    nothing). An engine makes one per distinct ending and hands it to every
    run that ends alike: it holds nothing of the run itself but ``account``.
    ``charge``: what ``account`` says the attempt spent, as the account book
    charges it, worked out when the outcome is made (every finish asks).
    """

    status: Outcome
    exit_code: int | None = None
    usage_limit: UsageLimit | None = None
    session: bool = False
    account: AccountSignals | None = None
    failure: Failure | None = None
    worked: bool = False
    charge: Charge = attrs.field(
        init=False, eq=False, repr=False, default=attrs.Factory(_charge_of, takes_self=True)
    )

    @property
    def spawned(self) -> bool:
        """Whether a process was spawned for the attempt."""
        return self.exit_code is not None
