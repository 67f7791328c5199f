"""An undo log: how to take back what one operation of a batch changed in memory."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, Final

_ABSENT: Final = object()


class UndoLog:
    """Steps that undo changes, run newest first by :meth:`undo`.

    The in-memory store keeps one, which each operation of an
    :meth:`apply` batch fills and which is cleared when the operation
    ends: an operation that raises is undone whole, as a SQL store's
    savepoint undoes it.
    """

    __slots__ = ("_steps",)

    def __init__(self) -> None:
        self._steps: list[Callable[[], None]] = []

    def add(self, step: Callable[[], None]) -> None:
        """Remember ``step``: it undoes the change about to be made."""
        self._steps.append(step)

    def keep(self, mapping: MutableMapping[Any, Any], key: Any) -> None:
        """Remember ``mapping[key]`` (or that it is absent) before it changes."""
        self._steps.append(_Restore(mapping, key, mapping.get(key, _ABSENT)))

    def undo(self) -> None:
        """Run every step, newest first, and forget them.

        They are taken out of the log before the first runs, so a step that
        raises leaves none of them behind to run twice.
        """
        steps, self._steps = self._steps, []
        for step in reversed(steps):
            step()

    def clear(self) -> None:
        """Forget every step: the changes they undo are kept."""
        self._steps.clear()


class _Restore:
    """Put back one key of a mapping as it was."""

    __slots__ = ("_key", "_mapping", "_value")

    def __init__(self, mapping: MutableMapping[Any, Any], key: Any, value: object) -> None:
        self._mapping = mapping
        self._key = key
        self._value = value

    def __call__(self) -> None:
        if self._value is _ABSENT:
            self._mapping.pop(self._key, None)
        else:
            self._mapping[self._key] = self._value
