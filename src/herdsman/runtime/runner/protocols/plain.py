"""The ``plain`` protocol: any CLI; the reply is stdout, success is exit code 0."""

from __future__ import annotations

import re
from typing import Final

from herdsman.runtime.runner.protocols.base import ProtocolAdapter, Verdict, clip, describe_exit
from herdsman.runtime.runner.spec import Outcome, UsageLimit

PLAIN_REPLY_LIMIT: Final = 1024 * 1024
"""The most stdout bytes ``plain`` keeps as the reply; the rest is only logged."""


class PlainAdapter(ProtocolAdapter):
    """Any CLI: the reply is stdout; success is exit code 0.

    The reply keeps at most ``PLAIN_REPLY_LIMIT`` bytes of stdout and says so
    in band when it was cut. With a ``usage_limit_pattern``, the first stdout
    or stderr line matching it is the usage-limit message; a named group
    ``resets_at`` holding unix seconds gives the reset time. A failure's
    reason ends with the last stderr line, the CLI's own word on why.
    """

    name = "plain"

    def __init__(self, usage_limit_pattern: str | None = None) -> None:
        super().__init__()
        self._reply = bytearray()
        self._total = 0
        self._pattern = re.compile(usage_limit_pattern) if usage_limit_pattern else None
        self._usage_limit: UsageLimit | None = None

    def feed_line(self, line: bytes) -> None:
        """Keep the line as part of the reply (within the bound).

        Any output of a plain CLI may be the trace of work done: it counts
        as having worked (:attr:`worked`).
        """
        if not self._worked and line.strip():
            self._worked = True
        self._total += len(line)
        room = PLAIN_REPLY_LIMIT - len(self._reply)
        if room > 0:
            self._reply += line[:room]
        self._match(line)

    def feed_stderr_line(self, line: bytes) -> None:
        """Keep the line as the last stderr line; check it for the usage-limit pattern."""
        super().feed_stderr_line(line)
        self._match(line)

    def _match(self, line: bytes) -> None:
        if self._pattern is None or self._usage_limit is not None:
            return
        text = line.decode("utf-8", errors="replace")
        found = self._pattern.search(text)
        if found is None:
            return
        resets_at: float | None = None
        if "resets_at" in self._pattern.groupindex:
            raw = found.group("resets_at")
            try:
                resets_at = float(raw) if raw else None
            except ValueError:
                resets_at = None
        self._usage_limit = UsageLimit(resets_at=resets_at, message=clip(text))

    @property
    def usage_limit(self) -> UsageLimit | None:
        """The usage limit matched by the pattern, if any."""
        return self._usage_limit

    def verdict(self, exit_code: int) -> Verdict:
        """Succeeded on exit code 0; the reply is stdout either way."""
        reply = self._reply.decode("utf-8", errors="replace")
        if self._total > len(self._reply):
            reply += (
                f"\n[… reply truncated: kept the first {len(self._reply)} "
                f"of {self._total} bytes of stdout; the log has all of it]"
            )
        ok = exit_code == 0
        error = None
        if not ok:
            error = describe_exit(exit_code)
            if self._last_stderr is not None:
                error += f": {self._last_stderr}"
        return Verdict(
            status=Outcome.SUCCEEDED if ok else Outcome.FAILED,
            result=reply,
            session_id=None,
            error=error,
            usage_limit=self._usage_limit,
        )
