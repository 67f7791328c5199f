"""The ``claude`` protocol: Claude Code with ``-p --output-format stream-json --verbose``.

The stream's lines, as Claude Code 2.x prints them (one JSON object a line):

* ``system`` with ``subtype`` ``init`` (``session_id``, ``model``, ``cwd``,
  ``tools``), and ``api_retry`` (``attempt``, ``max_retries``,
  ``retry_delay_ms``, ``error_status``, ``error``) while the API is retried;
* ``assistant``: ``message.content`` blocks, ``text``, ``thinking`` or
  ``tool_use`` (``name``, ``input``); a message Claude Code made up itself
  carries ``"error"`` (``authentication_failed`` when not logged in, its
  text then ``Not logged in · Please run /login``);
* ``user``: ``tool_result`` blocks (``tool_use_id``, ``content``, ``is_error``);
* ``rate_limit_event``: ``rate_limit_info`` (``status`` ``allowed``,
  ``allowed_warning`` or ``rejected``, ``resetsAt`` unix seconds,
  ``rateLimitType``, ``overageStatus``, ``isUsingOverage``);
* the final ``result``: ``is_error``, ``subtype`` (which says ``success``
  even when ``is_error`` is true), ``result``, ``errors``, ``num_turns``,
  ``duration_ms``, ``duration_api_ms``, ``total_cost_usd``, ``usage``,
  ``modelUsage``, ``terminal_reason``, ``api_error_status``, ``session_id``.

What the run spent and the API's signals are read beside the verdict, by
``claude_usage.py``.
"""

from __future__ import annotations

import json
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
from herdsman.runtime.runner.protocols.claude_usage import (
    ClaudeUsageReader,
    model_usage,
    result_tokens,
)
from herdsman.runtime.runner.run_usage import RunUsage, fraction, seconds, tokens_text
from herdsman.runtime.runner.spec import Outcome, UsageLimit
from herdsman.runtime.runner.usage import CLAUDE_LIMIT_RE, parse_claude_reset

EVENT_TYPES = frozenset(
    {"system", "assistant", "user", "result", "rate_limit_event", "stream_event"}
)
"""The ``type`` values of Claude Code's stream (how ``herdsman logs`` knows one)."""


def _error_kind(subtype: str | None, agent_error: str | None) -> str | None:
    # "success" beside is_error: true is noise; the assistant's own error says more.
    if subtype is not None and subtype != "success":
        return subtype
    return agent_error


class ClaudeAdapter(ProtocolAdapter):
    """Claude Code's stream-json: success means a ``result`` line with ``is_error`` false.

    Recognises the ``system``/``init`` line (``session_id``), the final
    ``result`` line, ``rate_limit_event`` lines whose ``rate_limit_info.status``
    is ``rejected`` while no overage is in use (a usage limit; ``resetsAt`` is
    unix seconds), an assistant message's ``error`` and ``api_retry`` lines
    (the cause, when no result line follows). A result text such as ``You've
    hit your limit · resets 8pm (Europe/Berlin)`` is a usage limit too. No
    result line means failure.
    """

    name = "claude"

    def __init__(self, *, now: Callable[[], float] = time.time) -> None:
        super().__init__()
        self._now = now
        self._session_id: str | None = None
        self._result_seen = False
        self._is_error = False
        self._result: str | None = None
        self._subtype: str | None = None
        self._errors: list[str] = []
        self._agent_error: str | None = None
        self._usage_limit: UsageLimit | None = None
        self._unparsed = 0
        self._spend = ClaudeUsageReader()

    def feed_line(self, line: bytes) -> None:
        """Read one stream-json event."""
        event = json_object(line)
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
            self._spend.on_rate_limit(event.get("rate_limit_info"))
        elif kind == "result":
            self._on_result(event)
            self._spend.on_result(event)
        elif kind == "assistant" and isinstance(event.get("error"), str):
            self._on_agent_error(event)
        elif kind == "assistant":
            self._spend.on_assistant(event, None, None)
            if not self._worked:
                self._worked = _calls_a_tool(event.get("message"))
        elif kind == "system" and event.get("subtype") == "api_retry":
            self._stream_error = _retry_text(event)
            self._auth_retried(self._spend.on_retry(event))

    def _on_agent_error(self, event: dict[str, Any]) -> None:
        self._agent_error = str(event["error"])
        text = _message_text(event.get("message"))
        self._spend.on_assistant(event, self._agent_error, text)
        self._stream_error = f"{text} ({self._agent_error})" if text else self._agent_error

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
                resets_at=parse_claude_reset(text, self._now()), message=clip(text)
            )

    @property
    def session_id(self) -> str | None:
        """The session id from the stream (init line or any later event)."""
        return self._session_id

    @property
    def usage_limit(self) -> UsageLimit | None:
        """The usage limit from a rejected rate-limit event or the result text."""
        return self._usage_limit

    @property
    def usage(self) -> RunUsage | None:
        """What the run spent and the API's signals, as far as the stream went."""
        return self._spend.usage(succeeded=self._result_seen and not self._is_error)

    def verdict(self, exit_code: int) -> Verdict:
        """Succeeded iff a result line said ``is_error: false``."""
        if not self._result_seen:
            cause = self._stream_error or self._last_stderr
            if cause is not None:
                error = f"claude: {cause} (no result line; {describe_exit(exit_code)})"
            else:
                error = f"claude printed no result line ({describe_exit(exit_code)})"
                if self._unparsed:
                    error += f"; {self._unparsed} stdout lines were not JSON"
            status, result = Outcome.FAILED, None
        elif self._is_error:
            detail = self._result or "; ".join(self._errors) or "no message"
            kind = _error_kind(self._subtype, self._agent_error)
            error = "claude reported an error" + (f" ({kind})" if kind else "")
            error += f": {clip(detail)}"
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


def _calls_a_tool(message: object) -> bool:
    """Whether an assistant message calls a tool: work that retrying may repeat."""
    blocks = message.get("content") if isinstance(message, dict) else None
    return isinstance(blocks, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_use" for block in blocks
    )


def _message_text(message: object) -> str | None:
    """The text blocks of an assistant message, joined."""
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return None
    texts = [
        block["text"]
        for block in message["content"]
        if isinstance(block, dict) and block.get("type") == "text" and text_of(block.get("text"))
    ]
    return clip(" ".join(texts)) if texts else None


def _retry_text(event: dict[str, Any]) -> str:
    """``API retry 2/10: rate_limit (HTTP 429)`` from an ``api_retry`` line."""
    attempt, most = event.get("attempt"), event.get("max_retries")
    text = "API retry" + (f" {attempt}/{most}" if attempt is not None else "")
    error = text_of(event.get("error"))
    if error is not None:
        text += f": {error}"
    if event.get("error_status") is not None:
        text += f" (HTTP {event['error_status']})"
    return text


_INPUT_KEYS = ("command", "file_path", "path", "pattern", "url", "query", "description", "prompt")


def _tool_input(value: object) -> str:
    """A tool call's input on one line: its telling field, else the input as JSON."""
    if isinstance(value, dict):
        for key in _INPUT_KEYS:
            text = text_of(value.get(key))
            if text is not None:
                return one_line(text)
    return one_line(json.dumps(value, ensure_ascii=False)) if value else ""


def _result_content(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            for block in content
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    return ""


class ClaudeRenderer(StreamRenderer):
    """Claude Code's stream as text: the session, assistant text, tool calls and results.

    Tool inputs are summarised by their telling field (a Bash command, a file
    path, a pattern); results are cut to a few lines; the final result line
    gives the outcome, turns, time and cost.
    """

    def __init__(self) -> None:
        self._tools: dict[str, str] = {}
        self._last_text: str | None = None

    def render(self, line: str) -> list[str]:
        """The text for one recorded line."""
        event = json_object(line)
        if event is None or event.get("type") not in EVENT_TYPES:
            return [line]
        kind = event["type"]
        if kind == "system":
            return self._system(event)
        if kind in ("assistant", "user"):
            shown = self._assistant(event) if kind == "assistant" else self._user(event)
            # A message of a shape not known here is shown rather than lost.
            return shown or [f"[{kind}] {one_line(line, 200)}"]
        if kind == "rate_limit_event":
            return _rate_limit_text(event.get("rate_limit_info"))
        if kind == "result":
            return self._result(event)
        return []  # stream_event: partial messages, whole ones follow

    def _system(self, event: dict[str, Any]) -> list[str]:
        subtype = event.get("subtype")
        if subtype == "init":
            parts = [f"session {event.get('session_id', '?')}"]
            parts += [f"{key} {event[key]}" for key in ("model", "cwd") if text_of(event.get(key))]
            return [" · ".join(parts)]
        if subtype == "api_retry":
            return [_retry_text(event)]
        return [f"[system: {subtype}]"]

    def _assistant(self, event: dict[str, Any]) -> list[str]:
        if isinstance(event.get("error"), str):
            text = _message_text(event.get("message"))
            return [f"error ({event['error']})" + (f": {text}" if text else "")]
        message = event.get("message")
        blocks = message.get("content") if isinstance(message, dict) else None
        out: list[str] = []
        for block in blocks if isinstance(blocks, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                self._last_text = block["text"].strip()
                out += self._last_text.splitlines()
            elif block.get("type") == "thinking" and text_of(block.get("thinking")):
                out.append(f"(thinking) {one_line(block['thinking'], 160)}")
            elif block.get("type") == "tool_use":
                name = str(block.get("name", "tool"))
                if isinstance(block.get("id"), str):
                    self._tools[block["id"]] = name
                summary = _tool_input(block.get("input"))
                out.append(f"→ {name}" + (f": {summary}" if summary else ""))
        return out

    def _user(self, event: dict[str, Any]) -> list[str]:
        message = event.get("message")
        blocks = message.get("content") if isinstance(message, dict) else None
        out: list[str] = []
        for block in blocks if isinstance(blocks, list) else []:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            name = self._tools.get(str(block.get("tool_use_id")), "tool")
            head = f"← {name}" + (" failed" if block.get("is_error") else "")
            lines = first_lines(_result_content(block.get("content")))
            if not lines:
                out.append(f"{head}: (no output)")
                continue
            out.append(f"{head}: {lines[0]}")
            out += [f"  {rest}" for rest in lines[1:]]
        return out

    def _result(self, event: dict[str, Any]) -> list[str]:
        facts: list[str] = []
        turns = event.get("num_turns")
        if isinstance(turns, int):
            facts.append(f"{turns} turn{'s' if turns != 1 else ''}")
        if isinstance(event.get("duration_ms"), int | float):
            facts.append(f"{event['duration_ms'] / 1000:.1f}s")
        if isinstance(event.get("total_cost_usd"), int | float):
            facts.append(f"${event['total_cost_usd']:.4f}")
        text = text_of(event.get("result"))
        if event.get("is_error"):
            subtype = event.get("subtype") if isinstance(event.get("subtype"), str) else None
            kind = _error_kind(subtype, None)
            errors = event.get("errors")
            detail = text or (
                "; ".join(str(e) for e in errors) if isinstance(errors, list) else None
            )
            head = "result: error" + (f" ({kind})" if kind else "")
            head += f": {one_line(detail, 500)}" if detail else ""
            return [" · ".join([head, *facts]), *_usage_text(event)]
        out = [" · ".join(["result: success", *facts])]
        if text is not None and text != self._last_text:
            out += text.splitlines()
        return out + _usage_text(event)


def _usage_text(event: dict[str, Any]) -> list[str]:
    """``tokens: 1,500 input · 2,100 output · API 39.9s``, and a line per model if several."""
    tokens = result_tokens(event.get("usage"))
    if tokens is None or tokens.total == 0:
        return []
    head = f"tokens: {tokens_text(tokens)}"
    api_time = seconds(event.get("duration_api_ms"))
    if api_time is not None:
        head += f" · API {api_time:.1f}s"
    models = model_usage(event.get("modelUsage"))
    if len(models) < 2:
        return [head]
    return [head] + [
        f"  {entry.model}: {tokens_text(entry.tokens)}"
        + (f" · ${entry.cost_usd:.4f}" if entry.cost_usd is not None else "")
        for entry in models
    ]


def _rate_limit_text(info: object) -> list[str]:
    if not isinstance(info, dict) or info.get("status") in (None, "allowed"):
        return []
    text = f"rate limit {info['status']}"
    if isinstance(info.get("rateLimitType"), str):
        text += f" ({info['rateLimitType']})"
    used = fraction(info.get("utilization"))
    if used is not None:
        text += f", {used:.0%} used"
    if isinstance(info.get("resetsAt"), int | float):
        text += f", resets {time.strftime('%Y-%m-%d %H:%M', time.localtime(info['resetsAt']))}"
    return [text]
