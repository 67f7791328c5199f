"""The fleet ledger's values: claim rules and results, refusals, members, polls, views.

What a :class:`~herdsman.runtime.store.fleet.FleetStore` takes and answers
(and the simulator's fleet ledger with it), apart from the SQL that decides
them; docs/fleet.md has the rules.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from herdsman.core.accounts import BudgetUnit
from herdsman.runtime.store.records import AccountUse, RunRecord

__all__ = [
    "FENCE_MARGIN",
    "AccountBudget",
    "ClaimResult",
    "ClaimRules",
    "FleetView",
    "Member",
    "Poll",
    "Refusal",
    "UsageByMember",
    "by_member",
    "lease_expired_reason",
]

#: Seconds a member's lease must have been over, by the server's clock,
#: before another member expires it and declares its runs lost: the time its
#: fence keeper may take to kill its agents once the lease is over
#: (fence_keeper.py, docs/fleet.md), with room for the member's clock to
#: run up to 500 ppm slower than the server's over the longest lease (1 h).
FENCE_MARGIN = 2.0


class Refusal(enum.StrEnum):
    """Why a claim was refused (the run stays as it was)."""

    #: The run is not queued any more: claimed by another member, or cancelled.
    GONE = "gone"
    #: A running run, anywhere in the fleet, shares its conversation or agent key.
    LANE_BUSY = "lane_busy"
    #: An earlier-submitted queued run shares one of its keys (FIFO per key).
    EARLIER_QUEUED = "earlier_queued"
    #: Its provider's fleet-wide cap is reached.
    PROVIDER_CAP = "provider_cap"
    #: The fleet-wide cap of the account it would spend is reached.
    ACCOUNT_CAP = "account_cap"
    #: The account it would spend rests after a usage limit (``account_limits``).
    ACCOUNT_RESTING = "account_resting"
    #: The account's budget for its window is spent, counting every member's runs.
    ACCOUNT_BUDGET = "account_budget"


def _copy_caps(caps: Mapping[Any, int]) -> dict[Any, int]:
    for key, cap in caps.items():
        if cap < 0:
            raise ValueError(f"fleet cap of {key!r} must be >= 0, got {cap}")
    return dict(caps)


def _positive(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"an account budget's {attribute.name} must be > 0, got {value!r}")


@attrs.frozen
class AccountBudget:
    """An account's quota budget: ``budget`` runs, run-minutes, tokens or dollars per ``window``.

    Counted as the account core counts it (docs/accounts.md): ``runs``, the
    runs started after ``now - window`` that got a process (or still run, or
    were lost); ``run_minutes``, the minutes of such runs that ended after
    ``now - window`` (a lost run: none) plus the minutes running ones have
    run so far within the window; ``tokens`` and ``usd``, what the runs that
    ended after ``now - window`` spent, plus each running run at the mean of
    those that stated the figure (``spent_with_estimate``).
    """

    window: float = attrs.field(validator=_positive)
    budget: float = attrs.field(validator=_positive)
    unit: BudgetUnit = "runs"


def _copy_budgets(
    budgets: Mapping[tuple[str, str], AccountBudget],
) -> dict[tuple[str, str], AccountBudget]:
    return dict(budgets)


@attrs.frozen
class ClaimRules:
    """What a claim checks beyond the run being queued.

    ``agent_exclusive``: the agent key is a lane (as ``[scheduling]
    agent_exclusive``; every member must agree). ``provider_caps``: at most
    this many runs of a provider run fleet-wide. ``account_caps``: at most
    this many runs spend ``(provider, account)`` fleet-wide. A provider or
    account not named has no fleet-wide cap (each member's own caps still
    apply in its local scheduler). ``account_budgets``: a run may spend
    ``(provider, account)`` only while that account's usage in its window,
    counting the runs of every member, is below its budget. Whatever the
    rules, no run is claimed on an account resting in ``account_limits``.
    """

    agent_exclusive: bool = True
    provider_caps: Mapping[str, int] = attrs.field(factory=dict, converter=_copy_caps)
    account_caps: Mapping[tuple[str, str], int] = attrs.field(factory=dict, converter=_copy_caps)
    account_budgets: Mapping[tuple[str, str], AccountBudget] = attrs.field(
        factory=dict, converter=_copy_budgets
    )


@attrs.frozen
class UsageByMember:
    """Runs counting toward quota windows (as ``account_usage``), this member's apart.

    Earlier attempts of re-queued and retried runs count too, each on the
    side of the member that ran it.
    """

    #: Runs (and earlier attempts) this member started.
    mine: list[AccountUse]
    #: Runs every other member, or an earlier supervisor, started; a lost
    #: one charged no run-minutes (``finished_at`` is its ``started_at``).
    elsewhere: list[AccountUse]


def by_member(runs: Iterable[Sequence[Any]], earlier: Iterable[Sequence[Any]]) -> UsageByMember:
    """Uses, each an :class:`AccountUse`'s fields then whether this member held it, split.

    ``runs``: the runs' own rows, by start then ``seq``; ``earlier``: earlier
    attempts, by start, ``seq``, attempt. Each side is ordered by start, at
    equal starts the runs' rows first, as ``account_usage`` orders them.
    """
    mine: list[AccountUse] = []
    elsewhere: list[AccountUse] = []
    for *use, held_here in runs:
        (mine if held_here else elsewhere).append(AccountUse(*use))
    again = False
    for *use, held_here in earlier:
        (mine if held_here else elsewhere).append(AccountUse(*use))
        again = True
    if again:  # stable: at equal starts, the runs' own rows come first
        mine.sort(key=_started)
        elsewhere.sort(key=_started)
    return UsageByMember(mine, elsewhere)


def _started(use: AccountUse) -> float:
    return use.started_at


@attrs.frozen
class ClaimResult:
    """Runs claimed (now running, held by the claimant) and runs refused, each in item order."""

    claimed: list[RunRecord]
    refused: list[tuple[str, Refusal]]


@attrs.frozen
class Member:
    """One supervisor of the fleet, as the ledger knows it."""

    id: str
    host: str
    pid: int
    joined_at: float
    lease_until: float

    @property
    def label(self) -> str:
        """The member as messages name it: ``host:pid``."""
        return f"{self.host}:{self.pid}"


@attrs.frozen
class Poll:
    """What a member's poll read: queued runs it has not seen, runs that left, cancels.

    ``runs``: queued runs submitted, or re-queued by a member, after the
    cursor polled with, by ``seq``; ``cursor``: where the next poll starts;
    ``cancels``: ``(run_id, reason)`` of the runs this member holds that
    another member asked it to cancel, by ``seq``; ``left``: the runs the
    member said it holds queued that are no longer queued in the ledger
    (claimed, cancelled, skipped, ended or pruned), in the order it gave them.
    """

    runs: list[RunRecord]
    cursor: int
    cancels: list[tuple[str, str]]
    left: list[str] = attrs.field(factory=list)


@attrs.frozen
class FleetView:
    """The fleet as the ledger knows it, for a status page.

    ``clock``: the server's clock when read (leases are on it);
    ``running``: running runs per ``(holder, provider)``, holder ``None``
    for runs no member holds (left by a sole supervisor, until expired).
    """

    clock: float
    members: list[Member]
    running: dict[tuple[str | None, str], int]


def lease_expired_reason(member: Member) -> str:
    """The ``reason`` a run of an expired member is recorded ``lost`` with."""
    return f"supervisor {member.label} lease expired"
