"""The spend part of a ``sim generate`` model: tokens per run, their prices, failure classes.

What it assumes (docs/simulator.md, "Spend and failures"): an agent calls
its model at a roughly steady pace while it works, so a run's tokens grow
with its duration. A run of duration ``d`` spends, of each kind,
``MEAN * d / mean duration * noise``: ``MEAN`` is the kind's mean per run
(``herdsman usage --by provider``: a kind's tokens over the runs), and the
noise, one draw per run shared by every kind, is lognormal with mean 1 and
the given ``sigma`` (0, the default: tokens exactly in proportion to the
duration). Its cost is its tokens times the provider's prices (US dollars
per million tokens of each kind). Failure classes (``--failures``, read by
``parse_shares``) are shares of all runs, drawn with ``--outcomes``'s in
one draw.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from typing import Any

from herdsman.sim.model import MAX_TOKEN_SIGMA, ModelError, PerKind, TokenModel, parse_number
from herdsman.sim.spend import TOKEN_KINDS

__all__ = [
    "draw_spend",
    "parse_prices",
    "parse_tokens",
]


_SUFFIXES = {"": 1, "k": 1_000, "m": 1_000_000, "M": 1_000_000, "g": 10**9, "G": 10**9}


def _count(flag: str, what: str, text: str) -> float:
    """A token count such as ``1200``, ``20k`` or ``1.5M``."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmMgG]?)", text.strip())
    if match is None:
        raise ModelError(
            f"{flag}: {what}: expected a count such as 1200, 20k or 1.5M, got {text!r}"
        )
    return float(match[1]) * _SUFFIXES[match[2]]


def _per_provider(
    flag: str, texts: Sequence[str], known: Sequence[str], example: str
) -> list[tuple[str, list[tuple[str, str]]]]:
    """``PROVIDER=KEY:VALUE,...`` flags, one per provider: the provider and its pairs."""
    out: list[tuple[str, list[tuple[str, str]]]] = []
    for text in texts:
        provider, equals, rest = text.partition("=")
        if not equals or not provider or not rest:
            raise ModelError(
                f"{flag}: expected PROVIDER=KIND:VALUE,..., e.g. {example}, got {text!r}"
            )
        if provider not in known:
            raise ModelError(
                f"{flag}: unknown provider {provider!r}; expected one of {', '.join(known)}"
            )
        if any(provider == seen for seen, _ in out):
            raise ModelError(f"{flag}: {provider} is given twice")
        pairs: list[tuple[str, str]] = []
        for item in rest.split(","):
            key, colon, value = item.strip().partition(":")
            if not colon or not key or not value:
                raise ModelError(
                    f"{flag}: {provider}: expected KIND:VALUE, e.g. {example}, got {item.strip()!r}"
                )
            if any(key == seen for seen, _ in pairs):
                raise ModelError(f"{flag}: {provider}: {key} is given twice")
            pairs.append((key, value))
        out.append((provider, pairs))
    return out


def parse_tokens(texts: Sequence[str], known: Sequence[str]) -> tuple[tuple[str, TokenModel], ...]:
    """``--tokens PROVIDER=input:20k,cache_read:400k,output:8k[,sigma:0.5]`` (repeatable)."""
    flag, example = "--tokens", "claude=input:20k,cache_read:400k,output:8k,sigma:0.5"
    models: list[tuple[str, TokenModel]] = []
    for provider, pairs in _per_provider(flag, texts, known, example):
        means: dict[str, float] = {}
        sigma = 0.0
        for key, value in pairs:
            if key == "sigma":
                sigma = parse_number(flag, f"{provider}: sigma", value, low=0, high=MAX_TOKEN_SIGMA)
            elif key in TOKEN_KINDS:
                means[key] = _count(flag, f"{provider}: {key}", value)
            else:
                raise ModelError(
                    f"{flag}: {provider}: unknown kind {key!r}; expected"
                    f" {', '.join(TOKEN_KINDS)} or sigma"
                )
        if not any(means.values()):
            raise ModelError(f"{flag}: {provider}: give at least one kind a mean > 0")
        models.append((provider, TokenModel(PerKind(**means), sigma)))
    return tuple(models)


def parse_prices(
    texts: Sequence[str], tokens: Sequence[tuple[str, TokenModel]], known: Sequence[str]
) -> tuple[tuple[str, PerKind], ...]:
    """``--token-prices PROVIDER=input:3,output:15`` (US dollars per million tokens)."""
    flag, example = "--token-prices", "claude=input:3,cache_read:0.3,cache_write:3.75,output:15"
    modelled = [name for name, _ in tokens]
    out: list[tuple[str, PerKind]] = []
    for provider, pairs in _per_provider(flag, texts, known, example):
        if provider not in modelled:
            raise ModelError(
                f"{flag}: {provider} has no --tokens to price; add --tokens {provider}=..."
            )
        prices: dict[str, float] = {}
        for key, value in pairs:
            if key not in TOKEN_KINDS:
                raise ModelError(
                    f"{flag}: {provider}: unknown kind {key!r}; expected {', '.join(TOKEN_KINDS)}"
                )
            prices[key] = parse_number(
                flag, f"{provider}: {key} (dollars per million tokens)", value, low=0
            )
        out.append((provider, PerKind(**prices)))
    return tuple(out)


def draw_spend(
    tokens: TokenModel,
    prices: PerKind | None,
    duration: float,
    mean_duration: float,
    rng: random.Random,
) -> dict[str, Any]:
    """A run's ``spend`` (the submit line's form), for a run of ``duration`` seconds.

    Draws from ``rng`` only when ``tokens.sigma`` > 0 (one lognormal draw).
    """
    sigma = tokens.sigma
    # mu = -sigma²/2: the noise's mean is 1, so each kind's mean is as given.
    noise = rng.lognormvariate(-(sigma**2) / 2, sigma) if sigma > 0 else 1.0
    scale = duration / mean_duration * noise if mean_duration > 0 else noise
    counts: dict[str, int] = {}
    for kind in TOKEN_KINDS:
        mean = getattr(tokens.means, kind)
        if mean > 0:
            counts[kind] = round(mean * scale)
    spend: dict[str, Any] = {"tokens": counts}
    if prices is not None:
        usd = math.fsum(count * getattr(prices, kind) for kind, count in counts.items())
        spend["cost_usd"] = round(usd / 1_000_000, 6)
    return spend
