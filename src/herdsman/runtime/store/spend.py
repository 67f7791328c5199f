"""What the ledger keeps of a run's spend, and its JSON views.

:class:`Spend` is a run record's ``spend`` (re-exported by
:mod:`herdsman.runtime.store.records`); the API, the CLI and the trace show
it as :func:`spend_json` writes it, and budgets count it as
:func:`budget_charge` says.
"""

from __future__ import annotations

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


def budget_charge(spend: Spend | None) -> tuple[int | None, float | None]:
    """What ``spend`` counts toward ``tokens`` and ``usd`` budgets (``Tokens.budgeted``, cost)."""
    if spend is None:
        return None, None
    return (None if spend.tokens is None else spend.tokens.budgeted), spend.cost_usd
