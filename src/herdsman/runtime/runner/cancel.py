"""``RunCancel``: stopping one run from outside its task."""

from __future__ import annotations

from collections.abc import Callable


class RunCancel:
    """A handle that cancels one run: an API cancel, or a forced shutdown.

    ``cancel(reason)`` may be called before :func:`execute` starts (the process
    is then never spawned) or while it runs (the process group is stopped and
    the outcome is ``cancelled`` with ``reason``). Only the first reason counts;
    later calls do nothing. Call it from the trio thread; from another thread,
    go through ``trio.from_thread.run_sync``.
    """

    def __init__(self) -> None:
        self._reason: str | None = None
        self._on_cancel: Callable[[str], None] | None = None

    @property
    def reason(self) -> str | None:
        """The reason given to the first ``cancel`` call, or None."""
        return self._reason

    @property
    def cancelled(self) -> bool:
        """Whether ``cancel`` has been called."""
        return self._reason is not None

    def cancel(self, reason: str) -> None:
        """Ask for the run to stop; idempotent."""
        if self._reason is not None:
            return
        self._reason = reason
        if self._on_cancel is not None:
            self._on_cancel(reason)

    def _attach(self, on_cancel: Callable[[str], None]) -> None:
        # Used by execute(): one handle drives one live run at a time, since
        # two runs sharing a handle would make "cancel this run" ambiguous.
        if self._on_cancel is not None:
            raise RuntimeError("this RunCancel is already attached to a running execute()")
        self._on_cancel = on_cancel

    def _detach(self) -> None:
        self._on_cancel = None
