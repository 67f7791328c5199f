"""Delta debugging (Zeller's ddmin): cut a failing input down to a few items that still fail."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import attrs

__all__ = ["Minimised", "ddmin"]

T = TypeVar("T")


@attrs.frozen
class Minimised:
    """What ddmin kept (``indices`` into the input, in order), and how many tries it took."""

    indices: tuple[int, ...]
    tries: int
    #: False when ``budget`` ran out first: the result fails but may not be 1-minimal.
    complete: bool


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool], *, budget: int = 200) -> Minimised:
    """A subsequence of ``items`` that still ``fails``, from which no single item can go.

    ``items`` as a whole must fail. ``fails`` is called at most ``budget``
    times (each distinct subsequence once); the order of ``items`` is kept.
    """
    current = list(range(len(items)))
    seen: dict[tuple[int, ...], bool] = {}
    tries = 0

    def test(indices: list[int]) -> bool:
        nonlocal tries
        key = tuple(indices)
        if key not in seen:
            tries += 1
            seen[key] = fails([items[i] for i in indices])
        return seen[key]

    granularity = 2
    while len(current) >= 2:
        chunks = _split(current, granularity)
        candidates = [*chunks, *(_without(chunks, n) for n in range(len(chunks)))]
        for number, candidate in enumerate(candidates):
            if tries >= budget:
                return Minimised(tuple(current), tries, complete=False)
            if test(candidate):
                current = candidate
                # A chunk alone fails: start again from halves of it; a
                # complement: keep the granularity, one chunk fewer.
                granularity = 2 if number < len(chunks) else max(granularity - 1, 2)
                break
        else:
            if granularity >= len(current):
                break
            granularity = min(len(current), granularity * 2)
    return Minimised(tuple(current), tries, complete=True)


def _split(indices: list[int], parts: int) -> list[list[int]]:
    size, extra = divmod(len(indices), parts)
    chunks, start = [], 0
    for n in range(parts):
        end = start + size + (1 if n < extra else 0)
        chunks.append(indices[start:end])
        start = end
    return [chunk for chunk in chunks if chunk]


def _without(chunks: list[list[int]], skip: int) -> list[int]:
    return [i for n, chunk in enumerate(chunks) if n != skip for i in chunk]
