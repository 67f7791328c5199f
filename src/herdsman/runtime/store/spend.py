"""What the ledger keeps of a run's spend, and its JSON views.

:class:`Spend` is a run record's ``spend`` (re-exported by
:mod:`herdsman.runtime.store.records`); the API, the CLI and the trace show
it as :func:`spend_json` writes it, and budgets count it as
:func:`budget_charge` says.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import attrs

from herdsman.runtime.runner.run_usage import ModelUsage, RunUsage, Tokens

if TYPE_CHECKING:
    from herdsman.runtime.store.records import JSON


@attrs.frozen(slots=True)
class Spend:
    """What the ledger keeps of a run's usage (:class:`RunUsage`): what it spent.

    ``tokens`` by kind (None: the stream gave no counts), ``cost_usd`` the
    provider's own figure (None: the stream gave none), ``models`` the same
    per model, sorted by name, ``turns`` and ``api_time`` (seconds) as the
    agent counted them. For a provider that reports a session's running
    totals (Codex), the figures are the run's own: what earlier runs of the
    same session spent is taken off when the run is recorded
    (:func:`own_spend`).
    """

    tokens: Tokens | None = None
    cost_usd: float | None = None
    models: tuple[ModelUsage, ...] = ()
    turns: int | None = None
    api_time: float | None = None


def tokens_json(tokens: Tokens) -> dict[str, JSON]:
    """Tokens by kind as JSON, with their ``total`` (reasoning is part of output)."""
    return {
        "input": tokens.input,
        "cache_read": tokens.cache_read,
        "cache_write": tokens.cache_write,
        "output": tokens.output,
        "reasoning": tokens.reasoning,
        "total": tokens.total,
    }


def spend_json(spend: Spend) -> dict[str, JSON]:
    """A run's spend as the API, the CLI and the trace show it (docs/operations.md)."""
    return {
        "tokens": None if spend.tokens is None else tokens_json(spend.tokens),
        "cost_usd": spend.cost_usd,
        "turns": spend.turns,
        "api_time": spend.api_time,
        "models": [
            {"model": m.model, "tokens": tokens_json(m.tokens), "cost_usd": m.cost_usd}
            for m in spend.models
        ],
    }


def spend_of(usage: RunUsage | None, before: Tokens | None = None) -> Spend | None:
    """What the ledger keeps of ``usage``; None when the stream said nothing of it.

    ``before``: what the earlier runs of the same session spent, taken off
    the counts of a stream that reports session totals (see :func:`own_spend`).
    """
    if usage is None:
        return None
    tokens = usage.tokens
    if tokens is not None and usage.session_totals and before is not None:
        tokens = own_spend(tokens, before)
    spend = Spend(tokens, usage.cost_usd, usage.models, usage.turns, usage.api_time)
    return None if spend == _NO_SPEND else spend


_NO_SPEND: Final = Spend()


def own_spend(totals: Tokens, before: Tokens) -> Tokens:
    """A resumed session's run's own tokens: its session totals less what earlier runs spent.

    Each kind is floored at zero: a session whose totals went down (its
    provider restarted the count) is not credited tokens back.
    """
    return Tokens(
        input=max(0, totals.input - before.input),
        cache_read=max(0, totals.cache_read - before.cache_read),
        cache_write=max(0, totals.cache_write - before.cache_write),
        output=max(0, totals.output - before.output),
        reasoning=max(0, totals.reasoning - before.reasoning),
    )


def spend_total(spends: Iterable[Spend | None]) -> Spend | None:
    """What the attempts of one run spent together, their spends summed in the order given.

    A figure is None when no attempt stated it (never a guessed zero); a
    model's entries are summed by name. None when no attempt had a spend.
    """
    present = [spend for spend in spends if spend is not None]
    if not present:
        return None
    tokens = [spend.tokens for spend in present if spend.tokens is not None]
    costs = [spend.cost_usd for spend in present if spend.cost_usd is not None]
    turns = [spend.turns for spend in present if spend.turns is not None]
    api_times = [spend.api_time for spend in present if spend.api_time is not None]
    models: dict[str, ModelUsage] = {}
    for spend in present:
        for model in spend.models:
            earlier = models.get(model.model)
            if earlier is None:
                models[model.model] = model
                continue
            cost = earlier.cost_usd
            if model.cost_usd is not None:
                cost = model.cost_usd if cost is None else cost + model.cost_usd
            models[model.model] = ModelUsage(model.model, earlier.tokens + model.tokens, cost)
    return Spend(
        tokens=sum(tokens[1:], tokens[0]) if tokens else None,
        cost_usd=sum(costs) if costs else None,
        models=tuple(models[name] for name in sorted(models)),
        turns=sum(turns) if turns else None,
        api_time=sum(api_times) if api_times else None,
    )


def budget_charge(spend: Spend | None) -> tuple[int | None, float | None]:
    """What ``spend`` counts toward ``tokens`` and ``usd`` budgets (``Tokens.budgeted``, cost)."""
    if spend is None:
        return None, None
    return (None if spend.tokens is None else spend.tokens.budgeted), spend.cost_usd
