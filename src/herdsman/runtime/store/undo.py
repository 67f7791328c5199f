"""An undo log: how to take back what one operation of a batch changed in memory."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any, Final

_ABSENT: Final = object()

Step = tuple[Callable[..., None], *tuple[Any, ...]]
"""One step of an undo: a function and the arguments to call it with."""


class UndoLog(list[Step]):
    """Steps that undo changes, each ``(function, *arguments)``, run newest first by :meth:`undo`.

    The in-memory store keeps one, which each operation of an
    :meth:`apply` batch fills and which is cleared when the operation
    ends: an operation that raises is undone whole, as a SQL store's
    savepoint undoes it. A list itself, and each step a tuple rather than
    a ``functools.partial``: the store logs a step for every record it
    puts, three a run in the simulator, with ``append`` (no Python call)
    and ``clear`` after each operation.
    """

    __slots__ = ()

    def keep(self, mapping: MutableMapping[Any, Any], key: Any) -> None:
        """Remember ``mapping[key]`` (or that it is absent) before it changes."""
        self.append((_restore, mapping, key, mapping.get(key, _ABSENT)))

    def undo(self) -> None:
        """Run every step, newest first, and forget them.

        They are taken out of the log before the first runs, so a step that
        raises leaves none of them behind to run twice.
        """
        steps = self.copy()
        self.clear()
        for function, *arguments in reversed(steps):
            function(*arguments)


def _restore(mapping: MutableMapping[Any, Any], key: Any, value: object) -> None:
    """Put back one key of a mapping as it was."""
    if value is _ABSENT:
        mapping.pop(key, None)
    else:
        mapping[key] = value
