"""Where a run's output goes: the log file, the excerpt and the protocol adapter."""

from __future__ import annotations

from collections.abc import Callable
from typing import BinaryIO, Final

import trio

from herdsman.runtime.runner.excerpt import ExcerptBuilder
from herdsman.runtime.runner.protocols import ProtocolAdapter

MAX_LINE: Final = 8 * 1024 * 1024
"""The longest stdout line handed to an adapter whole; longer ones arrive in pieces."""

STREAMS: Final = ("stdout", "stderr")
"""The child's output streams, in the order the outcome's partial lines are flushed."""


class _LineSplitter:
    """Cuts one stream into lines for an adapter, holding at most ``MAX_LINE`` bytes."""

    def __init__(self) -> None:
        self._partial = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            if self._partial:
                self._partial += data[start : newline + 1]
                lines.append(bytes(self._partial))
                self._partial.clear()
            else:
                lines.append(data[start : newline + 1])
            start = newline + 1
        self._partial += data[start:]
        while len(self._partial) >= MAX_LINE:
            lines.append(bytes(self._partial[:MAX_LINE]))
            del self._partial[:MAX_LINE]
        return lines

    def flush(self) -> bytes | None:
        if not self._partial:
            return None
        rest = bytes(self._partial)
        self._partial.clear()
        return rest


class Output:
    """The sink of one run's output: every chunk goes to the log, the excerpt and the adapter.

    ``last_activity`` is the trio time of the last chunk (the idle timeout
    counts from it); ``open_streams`` holds the streams not yet at EOF.
    """

    def __init__(self, log: BinaryIO, adapter: ProtocolAdapter, excerpt: ExcerptBuilder) -> None:
        self._log = log
        self._adapter = adapter
        self._excerpt = excerpt
        self._splitters = {stream: _LineSplitter() for stream in STREAMS}
        self.open_streams = set(STREAMS)
        self.last_activity = trio.current_time()
        self.failure: BaseException | None = None
        self._raising = True
        #: Called once, with the stream's words, when the adapter finds that
        #: the account is not logged in (``ProtocolAdapter.auth_failure``).
        self.on_auth_failure: Callable[[str], None] | None = None

    def keep_failures(self) -> None:
        """From now on keep the first failure in ``failure`` instead of raising it.

        For the stop: an error raised in the middle of stopping the group
        would leave it running and the child unreaped. The caller raises
        ``failure`` once the group is stopped.
        """
        self._raising = False

    def feed(self, stream: str, chunk: bytes) -> None:
        """Take one chunk read from ``stream``.

        The first failure (the log's disk full, say) is raised, or kept (see
        :meth:`keep_failures`); from then on chunks are dropped, so that
        stopping the run and draining its pipes cannot fail again.
        """
        self.last_activity = trio.current_time()
        if self.failure is not None:
            return
        try:
            self._log.write(chunk)
            # Flushed per chunk so `tail -f` on the log shows the run live.
            self._log.flush()
            self._excerpt.feed(chunk, stream)
            for line in self._splitters[stream].feed(chunk):
                self._to_adapter(stream, line)
        except Exception as error:
            self.failure = error
            if self._raising:
                raise

    def _to_adapter(self, stream: str, line: bytes) -> None:
        if stream == "stdout":
            adapter = self._adapter
            adapter.feed_line(line)
            if adapter.auth_failure is not None and self.on_auth_failure is not None:
                told, self.on_auth_failure = self.on_auth_failure, None
                told(adapter.auth_failure)
        else:
            self._adapter.feed_stderr_line(line)

    def close_stream(self, stream: str) -> None:
        """``stream`` reached EOF: hand the adapter its partial last line."""
        rest = self._splitters[stream].flush()
        if rest is not None:
            self._to_adapter(stream, rest)
        self.open_streams.discard(stream)

    def all_closed(self) -> bool:
        """Whether both streams reached EOF."""
        return not self.open_streams

    def finish(self) -> None:
        """Hand the adapter the partial last lines of streams that never closed."""
        for stream in STREAMS:
            if stream in self.open_streams:
                rest = self._splitters[stream].flush()
                if rest is not None:
                    self._to_adapter(stream, rest)
