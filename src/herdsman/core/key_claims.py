"""Exclusion keys claimed by work under way that the scheduler does not know yet.

A submit claims its run's keys before it waits for the ledger, so that an
``on_busy: "skip"`` follow-up arriving a moment later sees its conversation
busy; a polled run held back behind a worktree removal claims its
conversation the same way. :class:`KeyClaims` counts the claims per key and
forgets a key when its last claim is released, so every call costs the keys
it names: never the keys claimed by anything else.
"""

from __future__ import annotations

from collections.abc import Iterable


class KeyClaims:
    """Claims per key; a key is claimed while any claim of it is unreleased."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def claim(self, keys: Iterable[str]) -> None:
        """Claim each of ``keys`` once more (a key given twice is claimed twice)."""
        counts = self._counts
        for key in keys:
            counts[key] = counts.get(key, 0) + 1

    def release(self, keys: Iterable[str]) -> None:
        """Release one claim of each of ``keys``, as :meth:`claim` took them.

        Raises :class:`ValueError` for a key with no claim left: a release
        without its claim is a bug in the caller, never to be absorbed.
        """
        counts = self._counts
        for key in keys:
            left = counts.get(key, 0) - 1
            if left > 0:
                counts[key] = left
            elif left == 0:
                del counts[key]
            else:
                raise ValueError(f"key {key!r} released more often than it was claimed")

    def claimed(self, key: str) -> bool:
        """Whether ``key`` has a claim not yet released."""
        return key in self._counts

    def counts(self) -> dict[str, int]:
        """Claims per claimed key (no key with none), sorted by key."""
        return dict(sorted(self._counts.items()))
