"""A run's spend as the command line shows it, from the API's JSON (``spend_json``'s shape)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from herdsman.runtime.runner.run_usage import Tokens

__all__ = ["cost_text", "spend_lines", "tokens_cell", "tokens_of"]


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


def tokens_cell(spend: Mapping[str, Any] | None) -> str:
    """A run's tokens, all kinds together, for a table cell; empty when the stream gave none."""
    tokens = None if spend is None else spend["tokens"]
    return "" if tokens is None else f"{tokens['total']:,}"


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
