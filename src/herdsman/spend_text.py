"""A run's spend as the command line shows it, from the API's JSON (``spend_json``'s shape)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from herdsman.runtime.runner.run_usage import Tokens

__all__ = ["cost_text", "spend_lines", "spent_cell", "tokens_of", "tokens_short"]


def tokens_of(tokens: Mapping[str, Any]) -> Tokens:
    """The tokens of a spend's JSON (``tokens_json``'s shape)."""
    # Imported when used: the runner's package brings trio, which every
    # command would otherwise load at start.
    from herdsman.runtime.runner.run_usage import Tokens  # noqa: PLC0415

    return Tokens(
        input=tokens["input"],
        cache_read=tokens["cache_read"],
        cache_write=tokens["cache_write"],
        output=tokens["output"],
        reasoning=tokens["reasoning"],
    )


def cost_text(usd: float | None) -> str:
    """``$0.0123``, ``$12.50``; empty when no cost was stated (never a guessed ``$0``)."""
    if usd is None:
        return ""
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.4f}"


def tokens_short(count: int) -> str:
    """``850``, ``12.3k``, ``123k``, ``4.5M``: a token count in at most five characters or so."""
    for unit, size in (("M", 1_000_000), ("k", 1_000)):
        if count >= size:
            scaled = count / size
            return f"{scaled:.1f}{unit}" if scaled < 100 else f"{round(scaled)}{unit}"
    return str(count)


def spent_cell(spend: Mapping[str, Any] | None) -> str:
    """The ``runs`` table's ``spent`` cell: the cost where stated, else the tokens, else empty.

    Narrow on purpose (the table fits 80 columns): ``$0.0123``, or ``12.3k``
    tokens of a run whose stream stated no cost. ``runs RUN_ID`` has the rest.
    """
    if spend is None:
        return ""
    if spend["cost_usd"] is not None:
        return cost_text(spend["cost_usd"])
    tokens = spend["tokens"]
    return "" if tokens is None else tokens_short(tokens["total"])


def spend_lines(spend: Mapping[str, Any]) -> list[str]:
    """``runs RUN_ID``'s lines for a spend: the run's figures, then one line a model."""
    from herdsman.runtime.runner.run_usage import tokens_text  # noqa: PLC0415 - see tokens_of

    figures = []
    tokens = spend["tokens"]
    if tokens is not None:
        figures.append(f"{tokens['total']:,} tokens ({tokens_text(tokens_of(tokens))})")
    if spend["cost_usd"] is not None:
        figures.append(cost_text(spend["cost_usd"]))
    if spend["turns"] is not None:
        figures.append(f"{spend['turns']} turn{'' if spend['turns'] == 1 else 's'}")
    if spend["api_time"] is not None:
        figures.append(f"{spend['api_time']:.1f}s in the API")
    lines = [" · ".join(figures) or "nothing reported"]
    for model in spend["models"]:
        cost = cost_text(model["cost_usd"])
        lines.append(
            f"{model['model']}: {tokens_text(tokens_of(model['tokens']))}"
            + (f" · {cost}" if cost else "")
        )
    return lines
