"""Usage totals: what the ledger's runs spent, summed by conversation, account, provider or model.

:meth:`Store.usage` answers ``herdsman usage``: every store reads the
attempts with a spend that finished in the window — each run's newest
attempt (``RunRecord.spend``) and its earlier ones (``Attempt.spend``, kept
when a usage limit re-queued it or a retry tried it again) — and hands
them to :func:`usage_totals`, so the sums and their order are the same on
every store.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from herdsman.runtime.runner.run_usage import Tokens
from herdsman.runtime.store.records import Spend

__all__ = ["SpentAttempt", "UsageBy", "UsageTotal", "usage_totals"]


class UsageBy(enum.Enum):
    """What ``herdsman usage`` groups runs by."""

    CONVERSATION = "conversation"
    ACCOUNT = "account"
    PROVIDER = "provider"
    MODEL = "model"


@attrs.frozen(slots=True)
class SpentAttempt:
    """One attempt of a run that has a spend, as a usage total reads it.

    ``run_id`` names its run (a run's attempts count it once); ``account``
    is the account the attempt spent, which a usage limit's re-queue may
    have changed between attempts.
    """

    run_id: str
    provider: str
    account: str | None
    workspace: str
    conversation: str | None
    spend: Spend


@attrs.frozen(slots=True)
class UsageTotal:
    """What the runs of one group spent.

    ``group`` is the conversation, account, provider or model the runs share
    (None: no conversation, the ambient account); ``workspace`` the
    conversation's workspace when grouped by conversation (else None).
    Every attempt with a spend counts, not only each run's newest: a run
    retried or re-queued after a usage limit spent on its earlier attempts
    too. ``runs`` counts the runs, ``attempts`` their attempts that spent
    (by model, the attempts' entries for that model); ``tokens`` sums their
    counts (attempts whose stream gave none add nothing). ``cost_usd`` sums
    the costs the streams stated and ``priced`` counts the attempts (or, by
    model, the model entries) that stated one: a cost is None when none
    did, never a guess. ``turns`` and ``api_time`` (seconds) sum what was
    reported; by model they are None (the streams report them per run, not
    per model).
    """

    group: str | None
    workspace: str | None
    runs: int
    attempts: int
    tokens: Tokens
    cost_usd: float | None
    priced: int
    turns: int | None
    api_time: float | None


@attrs.define
class _Sum:
    run_ids: set[str] = attrs.field(factory=set)
    attempts: int = 0
    tokens: Tokens = attrs.field(factory=Tokens)
    cost: float = 0.0
    priced: int = 0
    turns: int | None = None
    api_time: float | None = None

    def add(
        self,
        run_id: str,
        tokens: Tokens | None,
        cost: float | None,
        turns: int | None = None,
        api_time: float | None = None,
    ) -> None:
        self.run_ids.add(run_id)
        self.attempts += 1
        if tokens is not None:
            self.tokens += tokens
        if cost is not None:
            self.cost += cost
            self.priced += 1
        if turns is not None:
            self.turns = (self.turns or 0) + turns
        if api_time is not None:
            self.api_time = (self.api_time or 0.0) + api_time


def usage_totals(attempts: Iterable[SpentAttempt], by: UsageBy) -> list[UsageTotal]:
    """The totals of ``attempts`` grouped ``by``, sorted by group (workspace, then conversation).

    ``attempts`` come in submission order of their runs, a run's oldest
    attempt first: the sums of costs (floats) then do not depend on how a
    store happened to return them.
    """
    sums: dict[tuple[str | None, str | None], _Sum] = {}
    for attempt in attempts:
        spend, run_id = attempt.spend, attempt.run_id
        if by is UsageBy.MODEL:
            for model in spend.models:
                sums.setdefault((None, model.model), _Sum()).add(
                    run_id, model.tokens, model.cost_usd
                )
            continue
        key: tuple[str | None, str | None]
        if by is UsageBy.CONVERSATION:
            key = (attempt.workspace, attempt.conversation)
        elif by is UsageBy.ACCOUNT:
            key = (None, attempt.account)
        else:
            key = (None, attempt.provider)
        sums.setdefault(key, _Sum()).add(
            run_id, spend.tokens, spend.cost_usd, spend.turns, spend.api_time
        )
    ordered = sorted(sums.items(), key=lambda item: (item[0][0] or "", _order(item[0][1])))
    return [
        UsageTotal(
            group=group,
            workspace=workspace,
            runs=len(total.run_ids),
            attempts=total.attempts,
            tokens=total.tokens,
            cost_usd=total.cost if total.priced else None,
            priced=total.priced,
            turns=total.turns,
            api_time=total.api_time,
        )
        for (workspace, group), total in ordered
    ]


def _order(group: str | None) -> tuple[bool, str]:
    # None (no conversation, the ambient account) first.
    return (group is not None, group or "")
