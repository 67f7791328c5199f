"""In-memory ledgers that fail or stall chosen operations, as a locked or full disk makes them."""

from __future__ import annotations

import threading
from typing import Any

from herdsman.runtime.store import MemoryStore, StoreError


class FlakyStore(MemoryStore):
    """A ledger whose chosen operations fail, as a locked or full disk makes them.

    An operation named in ``failing_once`` fails its first call only.
    """

    def __init__(self, failing: set[str], *, failing_once: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.failing = failing | failing_once
        self.failing_once = failing_once

    def __getattribute__(self, name: str) -> Any:
        failing = super().__getattribute__("failing")
        if name in failing:
            if name in super().__getattribute__("failing_once"):
                failing.discard(name)

            def fail(*args: Any, **kwargs: Any) -> Any:
                raise StoreError(f"run ledger: database is locked ({name})")

            return fail
        return super().__getattribute__(name)


class StalledStore(FlakyStore):
    """A :class:`FlakyStore` that can hold up one call: see :meth:`stall`."""

    def __init__(self, failing: set[str], *, failing_once: frozenset[str] = frozenset()) -> None:
        super().__init__(failing, failing_once=failing_once)
        self.stalling: str | None = None
        self.entered = threading.Event()
        self.go = threading.Event()

    def stall(self, name: str) -> None:
        """The next call of operation ``name`` sets ``entered``, then waits for ``go``."""
        self.stalling = name

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name != super().__getattribute__("stalling"):
            return attribute
        self.stalling = None

        def stalled(*args: Any, **kwargs: Any) -> Any:
            self.entered.set()  # in the ledger's worker thread: the event loop goes on
            self.go.wait(timeout=30)
            return attribute(*args, **kwargs)

        return stalled
