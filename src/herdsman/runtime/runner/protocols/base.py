"""What every protocol adapter shares: the verdict, the interface, reading a line.

An adapter is fed a run's stdout line by line (and its stderr) while the
process runs, and gives a :class:`Verdict` once it exited. Beside each adapter
lives its :class:`StreamRenderer`, which turns the same stream, as the log
recorded it, into text a person reads (``herdsman logs``): what a line means
is known in one place per provider kind.
"""

from __future__ import annotations

import json
import signal
from typing import Any, Final

import attrs

from herdsman.runtime.runner.api_failure import ApiFailure
from herdsman.runtime.runner.run_usage import ApiRetry, RunUsage
from herdsman.runtime.runner.spec import Outcome, UsageLimit

MESSAGE_LIMIT: Final = 1000
"""Characters of a provider message kept in a reason."""

SHOWN_LIMIT: Final = 300
"""Characters of a tool's input or output ``herdsman logs`` shows on one line."""

SHOWN_LINES: Final = 3
"""Lines of a tool's output ``herdsman logs`` shows before saying how many more there were."""


@attrs.frozen
class Verdict:
    """What an adapter concluded about a process that ended by itself.

    ``status`` is ``succeeded`` or ``failed``; ``error`` says why it failed.
    """

    status: Outcome
    result: str | None
    session_id: str | None
    error: str | None
    usage_limit: UsageLimit | None


def describe_exit(exit_code: int) -> str:
    """``exited with code 2`` or ``killed by signal SIGKILL``."""
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = str(-exit_code)
        return f"killed by signal {name}"
    return f"exited with code {exit_code}"


def clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` stripped and cut to ``limit`` characters, ending in ``…`` if cut."""
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str, limit: int = SHOWN_LIMIT) -> str:
    """``text`` on one line (its lines joined by `` ⏎ ``), cut to ``limit`` characters."""
    joined = " ⏎ ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return clip(joined, limit)


def first_lines(text: str, lines: int = SHOWN_LINES, limit: int = SHOWN_LIMIT) -> list[str]:
    """The first ``lines`` non-empty lines of ``text`` (each cut), and a note of the rest."""
    all_lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    shown = [clip(line, limit) for line in all_lines[:lines]]
    if len(all_lines) > lines:
        more = len(all_lines) - lines
        shown.append(f"… ({more} more line{'s' if more != 1 else ''})")
    return shown


def json_object(line: bytes | str) -> dict[str, Any] | None:
    """The JSON object on ``line``, or None when it holds anything else."""
    stripped = line.strip()
    opens = stripped.startswith(b"{") if isinstance(stripped, bytes) else stripped.startswith("{")
    if not opens:
        return None
    try:
        value = json.loads(stripped)
    except ValueError:  # also UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


def text_of(value: object) -> str | None:
    """``value`` if it is a non-empty string (after stripping), else None."""
    return value.strip() if isinstance(value, str) and value.strip() else None


#: Retries of a refused login after which a run is stopped. Claude Code
#: retries a 401 about ten times with growing delays (minutes in all), and
#: Codex five times; the first retry may follow a login that was refreshed
#: meanwhile, so one refusal alone does not stop a run.
AUTH_RETRIES_BEFORE_STOP: Final = 3


class ProtocolAdapter:
    """The interface every adapter offers: feed lines, then ask for the verdict.

    Every adapter keeps the last non-empty stderr line: when the stream has no
    final event, the agent's own last word on stderr is usually the cause
    (``Not inside a trusted directory …``), and the reason says it.
    """

    name: str = "plain"
    """The ``protocol`` value the adapter is for."""

    def __init__(self) -> None:
        self._last_stderr: str | None = None
        # The last error the stream itself reported (set by the adapters that read one).
        self._stream_error: str | None = None
        self._worked = False
        #: Set, in the stream's words, once the stream shows that the account
        #: is not logged in for good: the agent gave up, or kept retrying a
        #: refused login (:data:`AUTH_RETRIES_BEFORE_STOP`). The runner stops
        #: the run then, rather than let the agent retry until its timeout.
        self.auth_failure: str | None = None

    def feed_line(self, line: bytes) -> None:
        """Take one stdout line (with its newline, if it had one)."""
        raise NotImplementedError

    def _auth_retried(self, retry: ApiRetry | None) -> None:
        """An API retry the agent reported: a refused login, retried often enough, stops it."""
        if (
            self.auth_failure is None
            and retry is not None
            and retry.failure is ApiFailure.AUTHENTICATION
            and (retry.attempt or 0) >= AUTH_RETRIES_BEFORE_STOP
        ):
            self.auth_failure = self._stream_error or "authentication failed"

    def feed_stderr_line(self, line: bytes) -> None:
        """Take one stderr line: the last non-empty one is kept for the reason."""
        text = line.decode("utf-8", errors="replace").strip()
        if text:
            self._last_stderr = clip(text)

    def verdict(self, exit_code: int) -> Verdict:
        """The verdict for a process that exited by itself with ``exit_code``."""
        raise NotImplementedError

    @property
    def last_problem(self) -> str | None:
        """``last error: …``: the last error the agent reported in its stream, if any.

        Added to the reason of a run a limit stopped: an agent that cannot
        reach its API retries until the limit fires, and says so on its way.
        Only what the stream says is an error counts (a plain CLI's stderr
        is anything).
        """
        return None if self._stream_error is None else f"last error: {self._stream_error}"

    @property
    def session_id(self) -> str | None:
        """The session id seen so far (also useful when the run is stopped)."""
        return None

    @property
    def worked(self) -> bool:
        """Whether the agent may have done some of its work, as far as the stream went.

        What decides whether a failure of a class that retries only an
        attempt that did nothing is retried (docs/operations.md, "Retries"):
        each adapter says what counts.
        """
        return self._worked

    @property
    def usage_limit(self) -> UsageLimit | None:
        """The usage limit reported so far, if any."""
        return None

    @property
    def usage(self) -> RunUsage | None:
        """What the run spent and what its provider said, as far as the stream went.

        None when the stream said nothing of it (always, for a plain CLI).
        Reading it never changes the verdict.
        """
        return None


class StreamRenderer:
    """Turns one recorded stream into readable text, a line at a time.

    The base renders every line as recorded: what a plain CLI prints is
    already text. Lines that are not the protocol's JSON (stderr, banners)
    pass through unchanged in every renderer.
    """

    def render(self, line: str) -> list[str]:
        """The text for one recorded line (without its newline); [] to show nothing."""
        return [line]
