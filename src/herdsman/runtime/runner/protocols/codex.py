"""The ``codex`` protocol: Codex with ``exec --json``.

The stream's lines (one JSON object a line): ``thread.started``
(``thread_id``), ``turn.started``, ``item.started`` / ``item.updated`` /
``item.completed`` with an ``item`` whose ``type`` is ``agent_message`` or
``reasoning`` (``text``), ``command_execution`` (``command``,
``aggregated_output``, ``exit_code``, ``status``), ``file_change``
(``changes``: ``path``, ``kind``), ``mcp_tool_call`` (``server``,
``tool``), ``web_search`` (``query``), ``todo_list`` (``items``: ``text``,
``completed``) or ``error`` (``message``, a warning); ``turn.completed``
(``usage``: ``input_tokens``, ``cached_input_tokens``,
``cache_write_input_tokens``, ``output_tokens``, ``reasoning_output_tokens``;
read by ``codex_usage.py``),
``turn.failed`` (``error.message``) and ``error`` (``message``; Codex also
reports reconnects this way). Errors Codex meets before its stream starts
(``Not inside a trusted directory and --skip-git-repo-check was not
specified.``) go to stderr only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from herdsman.runtime.runner.protocols.base import (
    ProtocolAdapter,
    StreamRenderer,
    Verdict,
    clip,
    describe_exit,
    first_lines,
    json_object,
    one_line,
    text_of,
)
from herdsman.runtime.runner.protocols.codex_usage import CodexUsageReader
from herdsman.runtime.runner.run_usage import RunUsage
from herdsman.runtime.runner.spec import Outcome, UsageLimit
from herdsman.runtime.runner.usage import CODEX_LIMIT_RE, parse_codex_reset

EVENT_TYPES = frozenset(
    {
        "thread.started",
        "turn.started",
        "turn.completed",
        "turn.failed",
        "item.started",
        "item.updated",
        "item.completed",
        "error",
    }
)
"""The ``type`` values of Codex's stream (how ``herdsman logs`` knows one)."""


#: The items that act on the world: an attempt that began one may have done its work.
_WORK = frozenset({"command_execution", "file_change", "mcp_tool_call"})


def _item(event: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    item = event.get("item")
    if not isinstance(item, dict):
        return None, {}
    # Older Codex releases said item_type / assistant_message.
    kind = item.get("type", item.get("item_type"))
    return (kind if isinstance(kind, str) else None), item


class CodexAdapter(ProtocolAdapter):
    """Codex's ``exec --json`` stream: success needs a completed turn, nothing failed, exit 0.

    Recognises ``thread.started`` (``thread_id`` is the session id),
    ``item.completed`` with an ``agent_message`` item (its ``text`` is the
    reply; the last one wins), ``turn.completed``, ``turn.failed``
    (``error.message``) and ``error`` (``message``). An ``error`` followed by a
    completed turn was transient (Codex reports reconnects that way); one that
    is not followed by a completed turn, or any ``turn.failed``, is a failure.
    A message mentioning a usage limit is a usage limit, with the reset time
    parsed from it when present. With no event at all to go by, the reason
    is the last stderr line.
    """

    name = "codex"

    def __init__(self, *, now: Callable[[], float] = time.time) -> None:
        super().__init__()
        self._now = now
        self._session_id: str | None = None
        self._reply: str | None = None
        self._completed = False
        self._failed: str | None = None
        self._pending_error: str | None = None
        self._usage_limit: UsageLimit | None = None
        self._unparsed = 0
        self._spend = CodexUsageReader()

    def feed_line(self, line: bytes) -> None:
        """Read one JSONL event."""
        event = json_object(line)
        if event is None:
            if line.strip():
                self._unparsed += 1
            return
        kind = event.get("type")
        if kind == "thread.started":
            thread = event.get("thread_id")
            if isinstance(thread, str) and thread:
                self._session_id = thread
        elif kind == "item.started" and not self._worked:
            self._worked = _item(event)[0] in _WORK
        elif kind == "item.completed":
            item_kind, item = _item(event)
            if item_kind in _WORK:
                self._worked = True
            text = item.get("text")
            if item_kind in ("agent_message", "assistant_message") and isinstance(text, str):
                self._reply = text
        elif kind == "turn.completed":
            self._worked = True
            self._completed = True
            self._pending_error = None
            self._spend.on_turn_completed(event.get("usage"))
        elif kind == "turn.failed":
            message = self._message(event.get("error"))
            self._spend.on_error(message)
            self._failed = message or "turn failed"
            self._stream_error = self._failed
        elif kind == "error":
            message = self._message(event)
            retry = self._spend.on_error(message)
            self._pending_error = message or "error"
            self._stream_error = self._pending_error
            self._auth_retried(retry)

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
                resets_at=parse_codex_reset(message, self._now()), message=clip(message)
            )
        return clip(message)

    @property
    def session_id(self) -> str | None:
        """The thread id from ``thread.started``."""
        return self._session_id

    @property
    def usage_limit(self) -> UsageLimit | None:
        """The usage limit from an ``error`` or ``turn.failed`` message."""
        return self._usage_limit

    @property
    def usage(self) -> RunUsage | None:
        """The session's tokens and the API's signals, as far as the stream went."""
        ended_well = self._completed and self._failed is None and self._pending_error is None
        return self._spend.usage(succeeded=ended_well)

    def verdict(self, exit_code: int) -> Verdict:
        """Succeeded iff a turn completed, nothing failed after it, and the exit code is 0."""
        error: str | None = None
        if self._failed is not None:
            error = f"codex turn failed: {self._failed}"
        elif self._pending_error is not None:
            error = f"codex error: {self._pending_error}"
        elif not self._completed:
            if self._last_stderr is not None:
                error = (
                    f"codex: {self._last_stderr} "
                    f"(no turn.completed event; {describe_exit(exit_code)})"
                )
            else:
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


def _error_text(holder: object) -> str:
    if isinstance(holder, dict):
        message = holder.get("message")
        if isinstance(message, dict):
            message = message.get("message")
        return one_line(message, 500) if isinstance(message, str) else "(no message)"
    return one_line(holder, 500) if isinstance(holder, str) else "(no message)"


class CodexRenderer(StreamRenderer):
    """Codex's stream as text: the thread, messages, commands and their output, the turn's end.

    Items are shown once, when completed; a command's output is cut to a
    few lines.
    """

    def render(self, line: str) -> list[str]:
        """The text for one recorded line."""
        event = json_object(line)
        if event is None or event.get("type") not in EVENT_TYPES:
            return [line]
        kind = event["type"]
        if kind == "thread.started":
            return [f"session {event.get('thread_id', '?')}"]
        if kind == "item.completed":
            return _item_text(*_item(event))
        if kind == "turn.completed":
            return [_turn_completed(event.get("usage"))]
        if kind == "turn.failed":
            return [f"turn failed: {_error_text(event.get('error'))}"]
        if kind == "error":
            return [f"error: {_error_text(event)}"]
        return []  # turn.started, item.started/updated: the completed item follows


def _item_text(kind: str | None, item: dict[str, Any]) -> list[str]:
    text = text_of(item.get("text"))
    if kind in ("agent_message", "assistant_message"):
        return text.splitlines() if text else []
    if kind == "reasoning":
        return [f"(thinking) {one_line(text, 160)}"] if text else []
    if kind == "command_execution":
        head = f"$ {one_line(str(item.get('command', '')))}"
        code = item.get("exit_code")
        if code is not None:
            head += f"  (exit {code})"
        output = first_lines(str(item.get("aggregated_output") or ""))
        return [head, *(f"  {line}" for line in output)]
    if kind == "file_change":
        changes = item.get("changes")
        return [
            f"edited {change.get('path', '?')} ({change.get('kind', 'update')})"
            for change in (changes if isinstance(changes, list) else [])
            if isinstance(change, dict)
        ]
    if kind == "mcp_tool_call":
        status = item.get("status")
        return [
            f"→ {item.get('server', '?')}.{item.get('tool', '?')}"
            + (f" ({status})" if isinstance(status, str) else "")
        ]
    if kind == "web_search":
        return [f"search: {one_line(str(item.get('query', '')))}"]
    if kind == "todo_list":
        items = item.get("items")
        return [
            f"[{'x' if entry.get('completed') else ' '}] {one_line(str(entry.get('text', '')))}"
            for entry in (items if isinstance(items, list) else [])
            if isinstance(entry, dict)
        ]
    if kind == "error":
        return [f"warning: {_error_text(item)}"]
    return [f"[{kind or 'item'}]"]


def _turn_completed(usage: object) -> str:
    if not isinstance(usage, dict):
        return "turn completed"
    parts = [
        f"{label} {usage[key]}"
        for key, label in (
            ("input_tokens", "input tokens"),
            ("cached_input_tokens", "cached"),
            ("cache_write_input_tokens", "cache write"),
            ("output_tokens", "output tokens"),
            ("reasoning_output_tokens", "reasoning"),
        )
        # Zero cache writes and reasoning say nothing; the other counts always show.
        if isinstance(usage.get(key), int)
        and (usage[key] or key not in ("cache_write_input_tokens", "reasoning_output_tokens"))
    ]
    return "turn completed" + (f" · {', '.join(parts)}" if parts else "")
