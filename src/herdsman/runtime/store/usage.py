"""Usage totals: what the ledger's runs spent, summed by conversation, account, provider or model.

:meth:`Store.usage` answers ``herdsman usage``: every store reads the runs
with a spend (``RunRecord.spend``) that finished in the window and hands
them to :func:`usage_totals`, so the sums and their order are the same on
every store.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from herdsman.runtime.runner.run_usage import Tokens
from herdsman.runtime.store.records import Spend

__all__ = ["SpentRun", "UsageBy", "UsageTotal", "usage_totals"]


class UsageBy(enum.Enum):
    """What ``herdsman usage`` groups runs by."""

    CONVERSATION = "conversation"
    ACCOUNT = "account"
    PROVIDER = "provider"
    MODEL = "model"


@attrs.frozen(slots=True)
class SpentRun:
    """One run with a spend, as a usage total reads it."""

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
    ``runs`` counts the runs; ``tokens`` sums their counts (runs whose stream
    gave none add nothing). ``cost_usd`` sums the costs the streams stated
    and ``priced`` counts the runs (or, by model, the model entries) that
    stated one: a cost is None when none did, never a guess. ``turns`` and
    ``api_time`` (seconds) sum what was reported; by model they are None
    (the streams report them per run, not per model).
    """

    group: str | None
    workspace: str | None
    runs: int
    tokens: Tokens
    cost_usd: float | None
    priced: int
    turns: int | None
    api_time: float | None


@attrs.define
class _Sum:
    runs: int = 0
    tokens: Tokens = attrs.field(factory=Tokens)
    cost: float = 0.0
    priced: int = 0
    turns: int | None = None
    api_time: float | None = None

    def add(
        self,
        tokens: Tokens | None,
        cost: float | None,
        turns: int | None = None,
        api_time: float | None = None,
    ) -> None:
        self.runs += 1
        if tokens is not None:
            self.tokens += tokens
        if cost is not None:
            self.cost += cost
            self.priced += 1
        if turns is not None:
            self.turns = (self.turns or 0) + turns
        if api_time is not None:
            self.api_time = (self.api_time or 0.0) + api_time


def usage_totals(runs: Iterable[SpentRun], by: UsageBy) -> list[UsageTotal]:
    """The totals of ``runs`` grouped ``by``, sorted by group (workspace, then conversation).

    ``runs`` come in submission order: the sums of costs (floats) then do
    not depend on how a store happened to return them.
    """
    sums: dict[tuple[str | None, str | None], _Sum] = {}
    for run in runs:
        spend = run.spend
        if by is UsageBy.MODEL:
            for model in spend.models:
                sums.setdefault((None, model.model), _Sum()).add(model.tokens, model.cost_usd)
            continue
        key: tuple[str | None, str | None]
        if by is UsageBy.CONVERSATION:
            key = (run.workspace, run.conversation)
        elif by is UsageBy.ACCOUNT:
            key = (None, run.account)
        else:
            key = (None, run.provider)
        sums.setdefault(key, _Sum()).add(spend.tokens, spend.cost_usd, spend.turns, spend.api_time)
    ordered = sorted(sums.items(), key=lambda item: (item[0][0] or "", _order(item[0][1])))
    return [
        UsageTotal(
            group=group,
            workspace=workspace,
            runs=total.runs,
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
