"""Protocol adapters: reading an agent CLI's stdout into a verdict.

Each adapter is fed stdout line by line (and stderr, which only ``plain``
reads) while the process runs, and gives a :class:`Verdict` once it exited.
The exit code alone is not trusted for the agent CLIs: Claude Code and Codex
report success or failure in their JSON streams, so ``claude`` and ``codex``
decide from the stream and treat a stream without its final event as a
failure. Lines that are not JSON (banners, warnings) are ignored here; they
still reach the log and the excerpt.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable
from typing import Any, Final

import attrs

from herdsman.runtime.runner.spec import Outcome, UsageLimit
from herdsman.runtime.runner.usage import (
    CLAUDE_LIMIT_RE,
    CODEX_LIMIT_RE,
    parse_claude_reset,
    parse_codex_reset,
)

PLAIN_REPLY_LIMIT: Final = 1024 * 1024
"""The most stdout bytes ``plain`` keeps as the reply; the rest is only logged."""

_MESSAGE_LIMIT: Final = 1000  # characters of a provider message kept in a reason


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


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 1] + "…"


def _json_object(line: bytes) -> dict[str, Any] | None:
    stripped = line.strip()
    if not stripped.startswith(b"{"):
        return None
    try:
        value = json.loads(stripped)
    except ValueError:  # also UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


class ProtocolAdapter:
    """The interface every adapter offers: feed lines, then ask for the verdict."""

    def feed_line(self, line: bytes) -> None:
        """Take one stdout line (with its newline, if it had one)."""
        raise NotImplementedError

    def feed_stderr_line(self, line: bytes) -> None:
        """Take one stderr line; ignored unless the protocol reads stderr."""

    def verdict(self, exit_code: int) -> Verdict:
        """The verdict for a process that exited by itself with ``exit_code``."""
        raise NotImplementedError

    @property
    def session_id(self) -> str | None:
        """The session id seen so far (also useful when the run is stopped)."""
        return None

    @property
    def usage_limit(self) -> UsageLimit | None:
        """The usage limit reported so far, if any."""
        return None


class PlainAdapter(ProtocolAdapter):
    """Any CLI: the reply is stdout; success is exit code 0.

    The reply keeps at most ``PLAIN_REPLY_LIMIT`` bytes of stdout and says so
    in band when it was cut. With a ``usage_limit_pattern``, the first stdout
    or stderr line matching it is the usage-limit message; a named group
    ``resets_at`` holding unix seconds gives the reset time.
    """

    def __init__(self, usage_limit_pattern: str | None = None) -> None:
        self._reply = bytearray()
        self._total = 0
        self._pattern = re.compile(usage_limit_pattern) if usage_limit_pattern else None
        self._usage_limit: UsageLimit | None = None

    def feed_line(self, line: bytes) -> None:
        """Keep the line as part of the reply (within the bound)."""
        self._total += len(line)
        room = PLAIN_REPLY_LIMIT - len(self._reply)
        if room > 0:
            self._reply += line[:room]
        self._match(line)

    def feed_stderr_line(self, line: bytes) -> None:
        """Check the line for the usage-limit pattern."""
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
        self._usage_limit = UsageLimit(resets_at=resets_at, message=_clip(text))

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
        return Verdict(
            status=Outcome.SUCCEEDED if ok else Outcome.FAILED,
            result=reply,
            session_id=None,
            error=None if ok else describe_exit(exit_code),
            usage_limit=self._usage_limit,
        )


class ClaudeAdapter(ProtocolAdapter):
    """Claude Code with ``-p --output-format stream-json --verbose``.

    Recognises the ``system``/``init`` line (``session_id``), the final
    ``result`` line (``result``, ``is_error``, ``subtype``, ``session_id``,
    ``errors``), and ``rate_limit_event`` lines whose ``rate_limit_info.status``
    is ``rejected`` while no overage is in use (a usage limit; ``resetsAt`` is
    unix seconds). A result text such as ``You've hit your limit · resets 8pm
    (Europe/Berlin)`` is a usage limit too. Success means a result line with
    ``is_error`` false; no result line means failure.
    """

    def __init__(self, *, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._session_id: str | None = None
        self._result_seen = False
        self._is_error = False
        self._result: str | None = None
        self._subtype: str | None = None
        self._errors: list[str] = []
        self._usage_limit: UsageLimit | None = None
        self._unparsed = 0

    def feed_line(self, line: bytes) -> None:
        """Read one stream-json event."""
        event = _json_object(line)
        if event is None:
            if line.strip():
                self._unparsed += 1
            return
        kind = event.get("type")
        session = event.get("session_id")
        if isinstance(session, str) and session:
            # Every event carries it; init comes first, result last.
            self._session_id = session
        if kind == "rate_limit_event":
            self._rate_limit(event.get("rate_limit_info"))
        elif kind == "result":
            self._on_result(event)

    def _rate_limit(self, info: object) -> None:
        if not isinstance(info, dict) or info.get("status") != "rejected":
            return
        # Rejected on the plan but carried on by paid overage: not a limit.
        if info.get("isUsingOverage") is True or info.get("overageStatus") in (
            "allowed",
            "allowed_warning",
        ):
            return
        resets = info.get("resetsAt")
        kind = info.get("rateLimitType")
        message = "Claude usage limit reached" + (f" ({kind})" if isinstance(kind, str) else "")
        self._usage_limit = UsageLimit(
            resets_at=float(resets) if isinstance(resets, int | float) else None,
            message=message,
        )

    def _on_result(self, event: dict[str, Any]) -> None:
        self._result_seen = True
        self._is_error = bool(event.get("is_error"))
        result = event.get("result")
        self._result = result if isinstance(result, str) else None
        subtype = event.get("subtype")
        self._subtype = subtype if isinstance(subtype, str) else None
        errors = event.get("errors")
        if isinstance(errors, list):
            self._errors = [str(e) for e in errors if e]
        text = self._result or " ".join(self._errors)
        if self._is_error and CLAUDE_LIMIT_RE.search(text) and self._usage_limit is None:
            self._usage_limit = UsageLimit(
                resets_at=parse_claude_reset(text, self._now()), message=_clip(text)
            )

    @property
    def session_id(self) -> str | None:
        """The session id from the stream (init line or any later event)."""
        return self._session_id

    @property
    def usage_limit(self) -> UsageLimit | None:
        """The usage limit from a rejected rate-limit event or the result text."""
        return self._usage_limit

    def verdict(self, exit_code: int) -> Verdict:
        """Succeeded iff a result line said ``is_error: false``."""
        if not self._result_seen:
            error = f"claude printed no result line ({describe_exit(exit_code)})"
            if self._unparsed:
                error += f"; {self._unparsed} stdout lines were not JSON"
            status, result = Outcome.FAILED, None
        elif self._is_error:
            detail = self._result or "; ".join(self._errors) or "no message"
            error = f"claude reported an error ({self._subtype or 'error'}): {_clip(detail)}"
            status, result = Outcome.FAILED, self._result
        else:
            error, status, result = None, Outcome.SUCCEEDED, self._result
        return Verdict(
            status=status,
            result=result,
            session_id=self._session_id,
            error=error,
            usage_limit=self._usage_limit,
        )


class CodexAdapter(ProtocolAdapter):
    """Codex with ``exec --json``.

    Recognises ``thread.started`` (``thread_id`` is the session id),
    ``item.completed`` with an ``agent_message`` item (its ``text`` is the
    reply; the last one wins), ``turn.completed``, ``turn.failed``
    (``error.message``) and ``error`` (``message``). An ``error`` followed by a
    completed turn was transient (Codex reports reconnects that way); one that
    is not followed by a completed turn, or any ``turn.failed``, is a failure.
    A message mentioning a usage limit is a usage limit, with the reset time
    parsed from it when present.
    """

    def __init__(self, *, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._session_id: str | None = None
        self._reply: str | None = None
        self._completed = False
        self._failed: str | None = None
        self._pending_error: str | None = None
        self._usage_limit: UsageLimit | None = None
        self._unparsed = 0

    def feed_line(self, line: bytes) -> None:
        """Read one JSONL event."""
        event = _json_object(line)
        if event is None:
            if line.strip():
                self._unparsed += 1
            return
        kind = event.get("type")
        if kind == "thread.started":
            thread = event.get("thread_id")
            if isinstance(thread, str) and thread:
                self._session_id = thread
        elif kind == "item.completed":
            item = event.get("item")
            if isinstance(item, dict):
                # Older Codex releases said item_type / assistant_message.
                item_kind = item.get("type", item.get("item_type"))
                text = item.get("text")
                if item_kind in ("agent_message", "assistant_message") and isinstance(text, str):
                    self._reply = text
        elif kind == "turn.completed":
            self._completed = True
            self._pending_error = None
        elif kind == "turn.failed":
            self._failed = self._message(event.get("error")) or "turn failed"
        elif kind == "error":
            self._pending_error = self._message(event) or "error"

    def _message(self, holder: object) -> str | None:
        if isinstance(holder, str):
            message: object = holder
        elif isinstance(holder, dict):
            message = holder.get("message")
            if isinstance(message, dict):  # {"error": {"message": ...}} nesting
                message = message.get("message")
        else:
            return None
        if not isinstance(message, str):
            return None
        if CODEX_LIMIT_RE.search(message) and self._usage_limit is None:
            self._usage_limit = UsageLimit(
                resets_at=parse_codex_reset(message, self._now()), message=_clip(message)
            )
        return _clip(message)

    @property
    def session_id(self) -> str | None:
        """The thread id from ``thread.started``."""
        return self._session_id

    @property
    def usage_limit(self) -> UsageLimit | None:
        """The usage limit from an ``error`` or ``turn.failed`` message."""
        return self._usage_limit

    def verdict(self, exit_code: int) -> Verdict:
        """Succeeded iff a turn completed, nothing failed after it, and the exit code is 0."""
        error: str | None = None
        if self._failed is not None:
            error = f"codex turn failed: {self._failed}"
        elif self._pending_error is not None:
            error = f"codex error: {self._pending_error}"
        elif not self._completed:
            error = f"codex printed no turn.completed event ({describe_exit(exit_code)})"
            if self._unparsed:
                error += f"; {self._unparsed} stdout lines were not JSON"
        elif exit_code != 0:
            error = f"codex completed the turn but {describe_exit(exit_code)}"
        return Verdict(
            status=Outcome.FAILED if error else Outcome.SUCCEEDED,
            result=self._reply,
            session_id=self._session_id,
            error=error,
            usage_limit=self._usage_limit,
        )


def make_adapter(
    protocol: str,
    *,
    usage_limit_pattern: str | None = None,
    now: Callable[[], float] = time.time,
) -> ProtocolAdapter:
    """The adapter for ``protocol`` (``plain``, ``claude`` or ``codex``).

    ``now`` (unix seconds) dates relative reset times such as "try again in 2
    hours"; tests pass a fixed one.
    """
    if protocol == "plain":
        return PlainAdapter(usage_limit_pattern)
    if protocol == "claude":
        return ClaudeAdapter(now=now)
    if protocol == "codex":
        return CodexAdapter(now=now)
    raise ValueError(f"unknown protocol {protocol!r}; expected plain, claude or codex")
