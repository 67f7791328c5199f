"""Protocol adapters on recorded sample lines.

Where the samples come from (public material found with the code and issue
search; ids and long fields shortened, the shapes kept):

* Claude Code ``-p --output-format stream-json --verbose``: the ``system``/
  ``init`` and ``result`` lines as printed by CLI 2.x (fields ``session_id``,
  ``subtype``, ``is_error``, ``result``, ``num_turns``, ``total_cost_usd``);
  ``rate_limit_event`` lines with ``rate_limit_info`` (``status``
  ``allowed``/``rejected``, ``resetsAt`` in unix seconds, ``rateLimitType``,
  ``overageStatus``, ``isUsingOverage``); limit texts from anthropics/claude-code
  issues: "You've hit your limit · resets 8pm (Europe/Berlin)" (#42042),
  "… resets Apr 23 at 4pm (America/Recife)" (#51981), "Claude AI usage limit
  reached|1762952400" (#11429).
* Codex ``exec --json`` (codex-rs/exec/src/exec_events.rs): ``thread.started``
  with ``thread_id``, ``turn.started``, ``item.completed`` with ``item.type``
  ``reasoning``/``agent_message`` and ``text``, ``turn.completed`` with
  ``usage``, ``turn.failed`` with ``error.message``, ``error`` with
  ``message`` (also for transient reconnects); usage-limit texts from
  openai/codex issues: "You've hit your usage limit. Upgrade to Pro (…) or try
  again in 5 days 22 hours 11 minutes." (#3899) and "… Please try again at Apr
  11th, 2026 2:32 PM."
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from herdsman.runtime.runner.protocols import (
    PLAIN_REPLY_LIMIT,
    ProtocolAdapter,
    describe_exit,
    make_adapter,
)
from herdsman.runtime.runner.spec import Outcome

NOW = datetime(2026, 4, 1, 10, 0, tzinfo=UTC).timestamp()

CLAUDE_INIT = (
    b'{"type":"system","subtype":"init","cwd":"/tmp","session_id":'
    b'"dcde1c70-2f88-4993-91ed-9cff2b3f5d77","tools":[],"model":"claude-haiku-4-5-20251001",'
    b'"apiKeySource":"none"}\n'
)
CLAUDE_ASSISTANT = (
    b'{"type":"assistant","message":{"role":"assistant","content":[{"type":"text",'
    b'"text":"ok"}]},"parent_tool_use_id":null,'
    b'"session_id":"dcde1c70-2f88-4993-91ed-9cff2b3f5d77"}\n'
)
CLAUDE_RATE_ALLOWED = (
    b'{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","resetsAt":1771390800,'
    b'"rateLimitType":"five_hour","overageStatus":"rejected","overageDisabledReason":'
    b'"org_level_disabled","isUsingOverage":false},"uuid":"76258cfb",'
    b'"session_id":"dcde1c70-2f88-4993-91ed-9cff2b3f5d77"}\n'
)
CLAUDE_RATE_REJECTED = (
    b'{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1775559600,'
    b'"rateLimitType":"five_hour","overageStatus":"rejected","isUsingOverage":false},'
    b'"uuid":"2cfb","session_id":"dcde1c70-2f88-4993-91ed-9cff2b3f5d77"}\n'
)
CLAUDE_RESULT_OK = (
    b'{"type":"result","subtype":"success","is_error":false,"duration_ms":1136,'
    b'"duration_api_ms":1100,"num_turns":1,"result":"ok",'
    b'"session_id":"dcde1c70-2f88-4993-91ed-9cff2b3f5d77","total_cost_usd":0.0175496}\n'
)
CLAUDE_RESULT_ERROR = (
    b'{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":30,'
    b'"session_id":"dcde1c70-2f88-4993-91ed-9cff2b3f5d77"}\n'
)


def _claude(*lines: bytes) -> ProtocolAdapter:
    adapter = make_adapter("claude", now=lambda: NOW)
    for line in lines:
        adapter.feed_line(line)
    return adapter


def test_claude_success_needs_a_result_line_with_is_error_false() -> None:
    adapter = _claude(CLAUDE_INIT, CLAUDE_ASSISTANT, CLAUDE_RATE_ALLOWED, CLAUDE_RESULT_OK)
    verdict = adapter.verdict(0)
    assert verdict.status is Outcome.SUCCEEDED
    assert verdict.result == "ok"
    assert verdict.session_id == "dcde1c70-2f88-4993-91ed-9cff2b3f5d77"
    assert verdict.error is None
    assert verdict.usage_limit is None  # "allowed" is not a limit


def test_claude_session_id_comes_from_the_init_line_before_any_result() -> None:
    adapter = _claude(CLAUDE_INIT)
    assert adapter.session_id == "dcde1c70-2f88-4993-91ed-9cff2b3f5d77"


def test_claude_error_result_fails_even_with_exit_code_zero() -> None:
    verdict = _claude(CLAUDE_INIT, CLAUDE_RESULT_ERROR).verdict(0)
    assert verdict.status is Outcome.FAILED
    assert verdict.error == "claude reported an error (error_max_turns): no message"


def test_claude_without_result_line_fails_even_with_exit_code_zero() -> None:
    verdict = _claude(b"Welcome!\n", CLAUDE_INIT, b'{"type": "assist').verdict(0)
    assert verdict.status is Outcome.FAILED
    assert verdict.error == (
        "claude printed no result line (exited with code 0); 2 stdout lines were not JSON"
    )
    assert verdict.session_id == "dcde1c70-2f88-4993-91ed-9cff2b3f5d77"


def test_claude_rejected_rate_limit_event_is_a_usage_limit() -> None:
    adapter = _claude(CLAUDE_INIT, CLAUDE_RATE_REJECTED)
    assert adapter.usage_limit is not None
    assert adapter.usage_limit.resets_at == 1775559600.0
    assert adapter.usage_limit.message == "Claude usage limit reached (five_hour)"
    assert adapter.verdict(1).usage_limit == adapter.usage_limit


def test_claude_rejected_but_carried_by_overage_is_not_a_usage_limit() -> None:
    line = (
        b'{"type":"rate_limit_event","rate_limit_info":{"status":"rejected",'
        b'"overageStatus":"allowed","isUsingOverage":true,"resetsAt":1775559600}}\n'
    )
    assert _claude(line).usage_limit is None


@pytest.mark.parametrize(
    ("text", "resets_at"),
    [
        # 8pm in Berlin (CEST, UTC+2) on the same day.
        (
            "You've hit your limit · resets 8pm (Europe/Berlin)",
            datetime(2026, 4, 1, 18, 0, tzinfo=UTC).timestamp(),
        ),
        (
            "You've hit your limit · resets 6:20pm (Europe/Berlin)",
            datetime(2026, 4, 1, 16, 20, tzinfo=UTC).timestamp(),
        ),
        (
            "You've hit your limit · resets Apr 23 at 4pm (America/Recife)",
            datetime(2026, 4, 23, 19, 0, tzinfo=UTC).timestamp(),
        ),
        ("Claude AI usage limit reached|1762952400", 1762952400.0),
        ("You've hit your limit · resets 8pm (Not/AZone)", None),
    ],
)
def test_claude_limit_text_in_the_result_is_a_usage_limit(
    text: str, resets_at: float | None
) -> None:
    line = (
        b'{"type":"result","subtype":"success","is_error":true,"result":'
        + f'"{text}"'.encode()
        + b',"session_id":"s"}\n'
    )
    verdict = _claude(line).verdict(1)
    assert verdict.status is Outcome.FAILED
    assert verdict.usage_limit is not None
    assert verdict.usage_limit.resets_at == resets_at
    assert verdict.usage_limit.message == text


CODEX_THREAD = b'{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}\n'
CODEX_TURN = b'{"type":"turn.started"}\n'
CODEX_REASONING = (
    b'{"type":"item.completed","item":{"id":"item_0","type":"reasoning",'
    b'"text":"**Preparing web search query**"}}\n'
)
CODEX_MESSAGE = (
    b'{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"Done."}}\n'
)
CODEX_COMPLETED = (
    b'{"type":"turn.completed","usage":{"input_tokens":1200,"cached_input_tokens":200,'
    b'"output_tokens":345}}\n'
)


def _codex(*lines: bytes) -> ProtocolAdapter:
    adapter = make_adapter("codex", now=lambda: NOW)
    for line in lines:
        adapter.feed_line(line)
    return adapter


def test_codex_success_gives_the_agent_message_and_thread_id() -> None:
    verdict = _codex(
        CODEX_THREAD, CODEX_TURN, CODEX_REASONING, CODEX_MESSAGE, CODEX_COMPLETED
    ).verdict(0)
    assert verdict.status is Outcome.SUCCEEDED
    assert verdict.result == "Done."
    assert verdict.session_id == "0199a213-81c0-7800-8aa1-bbab2a035a53"
    assert verdict.error is None


def test_codex_older_item_shape_is_read_too() -> None:
    old = b'{"type":"item.completed","item":{"id":"1","item_type":"assistant_message","text":"Hi"}}'
    assert _codex(CODEX_THREAD, old, CODEX_COMPLETED).verdict(0).result == "Hi"


def test_codex_turn_failed_is_a_failure() -> None:
    verdict = _codex(
        CODEX_THREAD,
        CODEX_TURN,
        b'{"type":"error","message":"Reconnecting... 1/5 (unexpected status 404)"}\n',
        b'{"type":"turn.failed","error":{"message":"unexpected status 404 Not Found"}}\n',
    ).verdict(1)
    assert verdict.status is Outcome.FAILED
    assert verdict.error == "codex turn failed: unexpected status 404 Not Found"
    assert verdict.usage_limit is None


def test_codex_transient_error_followed_by_a_completed_turn_is_a_success() -> None:
    reconnect = b'{"type":"error","message":"Reconnecting... 1/5 (stream disconnected)"}\n'
    verdict = _codex(CODEX_THREAD, CODEX_TURN, reconnect, CODEX_MESSAGE, CODEX_COMPLETED)
    assert verdict.verdict(0).status is Outcome.SUCCEEDED


def test_codex_error_without_a_completed_turn_is_a_failure() -> None:
    verdict = _codex(CODEX_THREAD, b'{"type":"error","message":"stream error"}\n').verdict(1)
    assert verdict.status is Outcome.FAILED
    assert verdict.error == "codex error: stream error"


def test_codex_without_any_completed_turn_fails_even_with_exit_code_zero() -> None:
    verdict = _codex(CODEX_THREAD, CODEX_TURN, b"not json at all\n").verdict(0)
    assert verdict.status is Outcome.FAILED
    assert verdict.error == (
        "codex printed no turn.completed event (exited with code 0); 1 stdout lines were not JSON"
    )


def test_codex_usage_limit_with_a_relative_reset() -> None:
    message = (
        "You've hit your usage limit. Upgrade to Pro (https://openai.com/chatgpt/pricing) "
        "or try again in 5 days 22 hours 11 minutes."
    )
    verdict = _codex(
        CODEX_THREAD,
        CODEX_TURN,
        b'{"type":"error","message":"' + message.encode() + b'"}\n',
        b'{"type":"turn.failed","error":{"message":"' + message.encode() + b'"}}\n',
    ).verdict(1)
    assert verdict.status is Outcome.FAILED
    assert verdict.usage_limit is not None
    assert verdict.usage_limit.resets_at == NOW + 5 * 86400 + 22 * 3600 + 11 * 60
    assert verdict.usage_limit.message == message


def test_codex_usage_limit_with_an_absolute_local_reset() -> None:
    message = "You've hit your usage limit. Please try again at Apr 11th, 2026 2:32 PM."
    adapter = _codex(b'{"type":"error","message":"' + message.encode() + b'"}\n')
    assert adapter.usage_limit is not None
    # Codex prints local time; a naive datetime is local time too.
    assert adapter.usage_limit.resets_at == datetime(2026, 4, 11, 14, 32).timestamp()


def test_codex_usage_limit_error_body_with_resets_at() -> None:
    body = (
        '{\\"type\\":\\"usage_limit_reached\\",\\"message\\":\\"The usage limit has been '
        'reached\\",\\"resets_at\\":1777936568,\\"resets_in_seconds\\":13872}'
    )
    adapter = _codex(b'{"type":"error","message":"' + body.encode() + b'"}\n')
    assert adapter.usage_limit is not None
    assert adapter.usage_limit.resets_at == 1777936568.0


def test_plain_reply_is_stdout_and_success_is_exit_zero() -> None:
    adapter = make_adapter("plain")
    adapter.feed_line(b"hello\n")
    adapter.feed_line(b"world")
    adapter.feed_stderr_line(b"noise on stderr\n")
    ok = adapter.verdict(0)
    assert (ok.status, ok.result, ok.error) == (Outcome.SUCCEEDED, "hello\nworld", None)
    failed = adapter.verdict(2)
    # The last stderr line is the CLI's own word on why.
    assert (failed.status, failed.error) == (Outcome.FAILED, "exited with code 2: noise on stderr")


def test_plain_reply_is_bounded_and_says_it_was_truncated() -> None:
    adapter = make_adapter("plain")
    line = b"z" * 1023 + b"\n"
    for _ in range(2048):  # 2 MiB
        adapter.feed_line(line)
    result = adapter.verdict(0).result
    assert result is not None
    assert result.startswith("z" * 1023 + "\n")
    assert result.endswith(
        f"[… reply truncated: kept the first {PLAIN_REPLY_LIMIT} of {2 * 1024 * 1024} bytes "
        "of stdout; the log has all of it]"
    )
    assert len(result) < PLAIN_REPLY_LIMIT + 200


def test_plain_usage_limit_pattern_without_a_reset_group() -> None:
    adapter = make_adapter("plain", usage_limit_pattern=r"(?i)rate limit exceeded")
    adapter.feed_line(b"working\n")
    adapter.feed_stderr_line(b"Error: Rate limit exceeded for this account\n")
    verdict = adapter.verdict(1)
    assert verdict.usage_limit is not None
    assert verdict.usage_limit.resets_at is None
    assert verdict.usage_limit.message == "Error: Rate limit exceeded for this account"


def test_plain_without_a_pattern_never_reports_a_usage_limit() -> None:
    adapter = make_adapter("plain")
    adapter.feed_stderr_line(b"You've hit your usage limit\n")
    assert adapter.verdict(1).usage_limit is None


def test_unknown_protocol_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown protocol 'gemini'"):
        make_adapter("gemini")


def test_describe_exit() -> None:
    assert describe_exit(0) == "exited with code 0"
    assert describe_exit(-15) == "killed by signal SIGTERM"
