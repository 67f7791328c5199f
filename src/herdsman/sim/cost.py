"""``--cost KEY=PRICE``: what a configuration costs, to find the cheapest that meets an SLO.

KEY is a config key path, as ``--vary`` and ``--set`` name it; PRICE is what
one unit of that key's value costs **per month**, in whatever currency the
user prices in. A configuration's cost is the sum, over the priced keys, of
PRICE times the key's value in that configuration: ``providers.claude.
concurrency=40`` prices each Claude slot at 40 a month;
``providers.claude.accounts=200`` prices each Claude account (the key's
value is the number of accounts the provider has) at 200 a month. A priced
key need not be varied: its value is then the same in every configuration.

The value must be a number (a whole number of slots, a budget...); a key
whose value is not one — a duration, a name, a missing key — is refused
before anything is simulated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from herdsman.config.keypath import KeyPath
from herdsman.sim.sweep import SweepError, split_key_flag

__all__ = ["CostError", "Price", "configuration_cost", "parse_cost", "parse_costs"]


class CostError(ValueError):
    """A ``--cost`` flag that is wrong, or a key whose value cannot be priced."""


@attrs.frozen
class Price:
    """One ``--cost``: a key, its parsed path, and the price of one unit per month."""

    key: str
    path: KeyPath
    price: float


def parse_cost(text: str) -> Price:
    """Parse ``KEY=PRICE``; :class:`CostError` naming the flag if malformed."""
    where = f"--cost {text}"
    try:
        key, path, spec = split_key_flag(
            where,
            text,
            "KEY=PRICE (per unit per month), e.g. providers.claude.concurrency=40 or"
            " providers.claude.accounts=200",
        )
    except SweepError as error:
        raise CostError(str(error)) from None
    try:
        price = float(spec)
    except ValueError:
        price = math.nan
    if not math.isfinite(price) or price < 0:
        raise CostError(f"{where}: expected a price >= 0 such as 40 or 12.5, got {spec!r}")
    return Price(key, path, price)


def parse_costs(texts: Sequence[str]) -> list[Price]:
    """Parse every ``--cost``; a key priced twice is refused, not summed nor overridden."""
    prices: dict[str, Price] = {}
    for text in texts:
        price = parse_cost(text)
        earlier = prices.get(price.key)
        if earlier is not None:
            raise CostError(
                f"--cost {price.key}: priced twice, at {earlier.price:g} and {price.price:g};"
                " give each key one price"
            )
        prices[price.key] = price
    return list(prices.values())


def configuration_cost(config: Mapping[str, Any], prices: Sequence[Price], name: str) -> float:
    """The monthly cost of ``config`` (as a trace header carries it) under ``prices``.

    ``name`` says which configuration, for the error when a priced key has
    no numeric value in it.
    """
    total = 0.0
    for price in prices:
        value = _value(config, price.path)
        if isinstance(value, list) and _counts_accounts(price.path):
            value = len(value)  # priced per account
        if value is None:
            raise CostError(f"--cost {price.key}: {name} has no value for {price.key}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CostError(
                f"--cost {price.key}: {name} sets {price.key} to {value!r}, not a number"
                " to multiply the price by"
            )
        total += price.price * value
    return total


def _counts_accounts(path: KeyPath) -> bool:
    return len(path) == 3 and path[0] == "providers" and path[2] == "accounts"


def _value(config: Mapping[str, Any], path: KeyPath) -> Any:
    node: Any = config
    for part in path:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and part < len(node) else None
        else:
            node = node.get(part) if isinstance(node, Mapping) else None
        if node is None:
            return None
    return node
