"""``--vary KEY=RANGE``: the configurations a plan tries, and how each is made.

KEY is a config key path, set the way ``--set`` sets it
(:mod:`herdsman.config.overrides`). RANGE is ``A..B`` (whole numbers, both
ends included) or a comma-separated list of values (``1,2,4``, ``5m,15m``).
One key is special: ``providers.NAME.accounts=N`` gives the provider N
accounts — its first N declared ones, then copies of its last declared one
(same settings, named ``<last>-<k>`` for the k-th account), or, for a provider
declaring none, N accounts ``a1``...``aN`` with no settings.

Several ``--vary`` flags multiply: configurations are every combination,
ordered by the first flag's values, then the second's, and so on — that order
is what "the smallest configuration" means.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from herdsman.config import LoadedConfig
from herdsman.config.keypath import KeyPath, KeyPathError, parse_key_path
from herdsman.config.overrides import parse_value_text
from herdsman.sim.workload import config_from_trace
from herdsman.trace import TraceFormatError

__all__ = [
    "Setting",
    "SweepError",
    "Vary",
    "configure",
    "parse_vary",
    "settings",
    "split_key_flag",
]

_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


class SweepError(ValueError):
    """A ``--vary`` flag that is wrong."""


@attrs.frozen
class Vary:
    """One ``--vary``: a key and the values (as TOML text) it takes, in order."""

    key: str
    values: tuple[str, ...]
    #: ``providers.NAME.accounts=N``: the provider whose accounts are counted.
    accounts_of: str | None = None


#: One configuration of a sweep: each varied key and its value, in flag order.
Setting = tuple[tuple[str, str], ...]


def split_key_flag(where: str, text: str, expected: str) -> tuple[str, KeyPath, str]:
    """``KEY=SPEC`` of a flag: the key, its path and the spec, both stripped.

    :class:`SweepError` starting with ``where`` (the flag as written) when
    either side is missing (``expected`` says what would do) or the key is
    malformed.
    """
    key, equals, spec = text.partition("=")
    key, spec = key.strip(), spec.strip()
    if not equals or not key or not spec:
        raise SweepError(f"{where}: expected {expected}")
    try:
        return key, parse_key_path(key), spec
    except KeyPathError as error:
        raise SweepError(f"{where}: {error}") from None


def parse_vary(text: str) -> Vary:
    """Parse ``KEY=RANGE``; :class:`SweepError` naming the flag if malformed."""
    where = f"--vary {text}"
    key, path, spec = split_key_flag(
        where,
        text,
        "KEY=RANGE, e.g. providers.claude.concurrency=1..8 or supervisor.max_concurrency=2,4,8",
    )
    match = _RANGE.fullmatch(spec)
    if match is not None:
        low, high = int(match[1]), int(match[2])
        if low > high:
            raise SweepError(f"{where}: the range {spec} is empty: write it low..high")
        values = tuple(str(n) for n in range(low, high + 1))
    else:
        values = tuple(v.strip() for v in spec.split(","))
        if any(not v for v in values):
            raise SweepError(f"{where}: an empty value in {spec!r}")
    if len(set(values)) != len(values):
        raise SweepError(f"{where}: a value is given twice in {spec!r}")
    accounts_of = None
    if len(path) == 3 and path[0] == "providers" and path[2] == "accounts":
        accounts_of = str(path[1])
        for value in values:
            number = parse_value_text(value)
            if not isinstance(number, int) or isinstance(number, bool) or number < 1:
                raise SweepError(
                    f"{where}: a number of accounts must be a whole number >= 1, got {value!r}"
                )
    return Vary(key, values, accounts_of)


def settings(varies: Sequence[Vary]) -> list[Setting]:
    """Every combination of the varied values, smallest first."""
    keys = [vary.key for vary in varies]
    if len(set(keys)) != len(keys):
        raise SweepError("--vary: a key is varied twice")
    return [
        tuple(zip(keys, combination, strict=True))
        for combination in itertools.product(*(vary.values for vary in varies))
    ]


def configure(config: Mapping[str, Any], varies: Sequence[Vary], setting: Setting) -> LoadedConfig:
    """``config`` (a trace header's) with ``setting`` applied, validated.

    A value the configuration refuses is a :class:`SweepError` naming the key
    and value and what the configuration expects.
    """
    changed = copy.deepcopy(dict(config))
    overrides = []
    for vary, (key, value) in zip(varies, setting, strict=True):
        if vary.accounts_of is not None:
            _set_accounts(changed, vary.accounts_of, int(value), key)
        else:
            overrides.append(f"{key}={value}")
    name = "--vary " + " ".join(f"{key}={value}" for key, value in setting)
    try:
        return config_from_trace(changed, name, overrides)
    except TraceFormatError as error:
        raise SweepError(str(error).replace(f"{name}: config: ", f"{name}: ", 1)) from None


def _set_accounts(config: dict[str, Any], provider: str, count: int, key: str) -> None:
    providers = config.get("providers") or {}
    if provider not in providers:
        known = ", ".join(providers) or "none"
        raise SweepError(
            f"--vary {key}: no provider {provider!r} in the configuration (it has {known})"
        )
    declared = list(providers[provider].get("accounts") or [])
    accounts = declared[:count]
    if declared:
        last = declared[-1]
        for number in range(len(accounts) + 1, count + 1):
            accounts.append({**last, "name": f"{last['name']}-{number}"})
    else:
        accounts = [{"name": f"a{number}"} for number in range(1, count + 1)]
    providers[provider] = {**providers[provider], "accounts": accounts}
