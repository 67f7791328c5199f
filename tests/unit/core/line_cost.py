"""Cost counted, not timed: lines of given modules one call executes.

A trace function sees every line executed in the named source files (in
comprehensions and generators too), so the count is the same on any machine
and under any load; a cost that grows with a collection shows as a count
that grows with it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType, ModuleType
from typing import Any, TypeVar

T = TypeVar("T")


def lines_run(modules: tuple[ModuleType, ...], call: Callable[[], T]) -> tuple[int, T]:
    """How many lines of ``modules`` ``call()`` executes, and what it returned."""
    sources = {module.__file__ for module in modules}
    lines = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal lines
        if frame.f_code.co_filename not in sources:
            return None
        if event == "line":
            lines += 1
        return trace

    sys.settrace(trace)
    try:
        result = call()
    finally:
        sys.settrace(None)
    return lines, result
