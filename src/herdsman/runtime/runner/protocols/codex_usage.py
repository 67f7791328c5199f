"""Reading what a Codex run spent, and what the API said, from its ``exec --json`` stream.

The figures come from ``turn.completed``'s ``usage``: ``input_tokens``,
``cached_input_tokens``, ``cache_write_input_tokens``, ``output_tokens``,
``reasoning_output_tokens``. They are the session's running totals, so the
last one counts (never their sum), and a resumed session's run includes
what its earlier runs spent. Codex's ``input_tokens`` includes the cached
input and the input written to the cache, and its ``output_tokens`` the
reasoning: the fresh input is what is left once the cache's are taken out.
Codex states no cost, no time and no model per turn.

The signals are in English only: an ``error`` line ``Reconnecting... 2/5
(…)`` is a retry Codex made by itself, any other ``error`` or a
``turn.failed`` a failure, its class read from the text
(``api_failure.failure_of_text``). A usage-limit message is no failure
class. A run whose turn completed (the adapter's success) has no failure.
"""

from __future__ import annotations

import re
from typing import Final

from herdsman.runtime.runner.api_failure import ApiFailure, failure_of_text, status_in
from herdsman.runtime.runner.run_usage import ApiRetry, RunUsage, Tokens, count

_RECONNECTING: Final = re.compile(r"^\s*Reconnecting\.\.\.\s*(?:(\d+)\s*/\s*(\d+))?\s*(.*)$", re.S)


def turn_tokens(usage: object) -> Tokens | None:
    """``turn.completed``'s ``usage`` as disjoint tokens; None when no count can be read."""
    if not isinstance(usage, dict):
        return None
    keys = (
        "input_tokens",
        "cached_input_tokens",
        "cache_write_input_tokens",
        "output_tokens",
        "reasoning_output_tokens",
    )
    counts = [count(usage.get(key)) for key in keys]
    if all(value is None for value in counts):
        return None
    given, cached, written, output, reasoning = (value or 0 for value in counts)
    return Tokens(
        input=max(given - cached - written, 0),
        cache_read=cached,
        cache_write=written,
        output=output,
        reasoning=reasoning,
    )


def retry_of(message: str) -> ApiRetry | None:
    """A ``Reconnecting... 2/5 (cause)`` message as an :class:`ApiRetry`; None for another."""
    found = _RECONNECTING.match(message)
    if found is None:
        return None
    attempt, most, cause = found.groups()
    return ApiRetry(
        attempt=int(attempt) if attempt else None,
        max_retries=int(most) if most else None,
        delay=None,
        status=status_in(cause),
        failure=failure_of_text(cause),
    )


class CodexUsageReader:
    """Collects a Codex run's usage and signals, one event at a time."""

    def __init__(self) -> None:
        self._tokens: Tokens | None = None
        self._turns = 0
        self._failure: ApiFailure | None = None
        self._retries = 0
        self._last_retry: ApiRetry | None = None

    def on_turn_completed(self, usage: object) -> None:
        """A ``turn.completed``: the session's totals so far."""
        self._turns += 1
        tokens = turn_tokens(usage)
        if tokens is not None:
            self._tokens = tokens

    def on_error(self, message: str | None) -> ApiRetry | None:
        """An ``error`` line's or a ``turn.failed``'s message (None: it had none readable).

        Returns the retry it reports, if it reports one.
        """
        if message is None:
            self._failure = ApiFailure.OTHER
            return None
        retry = retry_of(message)
        if retry is not None:
            self._retries += 1
            self._last_retry = retry
            self._failure = retry.failure
        else:
            self._failure = failure_of_text(message)
        return retry

    def usage(self, *, succeeded: bool) -> RunUsage | None:
        """What was read, None if nothing; ``succeeded``: the run's verdict was success."""
        found = RunUsage(
            tokens=self._tokens,
            turns=self._turns or None,
            session_totals=self._tokens is not None,
            failure=None if succeeded else self._failure,
            retries=self._retries,
            last_retry=self._last_retry,
        )
        return None if found.empty else found
