"""The adapters' reasons and ``herdsman logs``' text on recorded and written streams.

The streams are in tests/fixtures/agent_streams (its README says which were
recorded from the real CLIs and how).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.runner.protocols import LogText, make_adapter
from herdsman.runtime.runner.spec import Outcome

STREAMS = Path(__file__).resolve().parents[2] / "fixtures" / "agent_streams"


def stream(name: str, suffix: str) -> bytes:
    path = STREAMS / f"{name}.{suffix}"
    return path.read_bytes() if path.exists() else b""


def verdict_of(name: str, protocol: str, exit_code: int) -> tuple[Outcome, str | None]:
    adapter = make_adapter(protocol, now=lambda: 1_775_000_000.0)
    for line in stream(name, "stdout").splitlines(keepends=True):
        adapter.feed_line(line)
    for line in stream(name, "stderr").splitlines(keepends=True):
        adapter.feed_stderr_line(line)
    verdict = adapter.verdict(exit_code)
    return verdict.status, verdict.error


@pytest.mark.parametrize(
    ("name", "protocol", "exit_code", "reason"),
    [
        (
            "claude-not-logged-in",
            "claude",
            1,
            "claude reported an error (authentication_failed): Not logged in · Please run /login",
        ),
        (
            "claude-api-retry-truncated",
            "claude",
            1,
            "claude: API retry 2/10: server_error (HTTP 529) (no result line; exited with code 1)",
        ),
        (
            "claude-malformed",
            "claude",
            0,
            "claude reported an error (error_max_turns): Reached maximum number of turns (30)",
        ),
        (
            "codex-untrusted-dir",
            "codex",
            1,
            "codex: Not inside a trusted directory and --skip-git-repo-check was not specified."
            " (no turn.completed event; exited with code 1)",
        ),
        (
            "codex-truncated",
            "codex",
            101,
            "codex: thread panicked at codex-rs/exec/src/lib.rs: stdout closed"
            " (no turn.completed event; exited with code 101)",
        ),
        (
            "codex-turn-failed",
            "codex",
            1,
            "codex turn failed: You've hit your usage limit. Upgrade to Pro"
            " (https://openai.com/chatgpt/pricing) or try again in 2 hours 5 minutes.",
        ),
        ("codex-session", "codex", 0, None),
        ("claude-tools", "claude", 0, None),
    ],
)
def test_the_reason_names_the_real_cause(
    name: str, protocol: str, exit_code: int, reason: str | None
) -> None:
    status, error = verdict_of(name, protocol, exit_code)
    assert error == reason
    assert status is (Outcome.SUCCEEDED if reason is None else Outcome.FAILED)


def test_the_last_problem_of_a_stream_that_never_ends_is_its_last_error() -> None:
    # Codex without network retries for ever; a limit stops it, and says why.
    adapter = make_adapter("codex")
    for line in stream("codex-no-network", "stdout").splitlines(keepends=True):
        adapter.feed_line(line)
    assert adapter.last_problem == (
        "last error: Reconnecting... waiting for network (Connection failed: error sending request)"
    )
    claude = make_adapter("claude")
    for line in stream("claude-api-retry-truncated", "stdout").splitlines(keepends=True):
        claude.feed_line(line)
    assert claude.last_problem == "last error: API retry 2/10: server_error (HTTP 529)"
    # A plain CLI's stderr is anything: not taken for an error.
    plain = make_adapter("plain")
    plain.feed_stderr_line(b"fetching...\n")
    assert plain.last_problem is None


def test_without_any_cause_the_reason_says_what_was_missing() -> None:
    adapter = make_adapter("claude")
    adapter.feed_line(b"Welcome!\n")
    assert adapter.verdict(0).error == (
        "claude printed no result line (exited with code 0); 1 stdout lines were not JSON"
    )


def render(data: bytes) -> str:
    text = LogText()
    return text.feed(data) + text.finish()


def log_of(name: str) -> bytes:
    # As the runner records it: what each stream wrote, in arrival order.
    return stream(name, "stdout") + stream(name, "stderr")


def test_a_claude_session_reads_as_text() -> None:
    assert render(log_of("claude-tools")).splitlines() == [
        "session 4b1f0c9e-2d33-4f6a-9a51-0e6c2f1d7a10 · model claude-sonnet-4-5 · cwd /srv/app",
        "(thinking) The user wants the failing test fixed. ⏎ First run the suite.",
        "I'll run the tests first.",
        "→ Bash: pytest -x -q tests/test_parse.py",
        "← Bash failed: F",
        "  =================================== FAILURES ===================================",
        "  ___________________________ test_parse_empty ___________________________",
        "  … (3 more lines)",
        "→ Edit: /srv/app/parse.py",
        "← Edit: The file /srv/app/parse.py has been updated.",
        "Fixed: `parse('')` now returns an empty list.",
        "The test passes.",
        "result: success · 3 turns · 12.3s · $0.0421",
        "tokens: 30 input · 85 output · API 11.0s",
    ]


def test_claude_not_logged_in_reads_as_text() -> None:
    lines = render(log_of("claude-not-logged-in")).splitlines()
    assert lines[0].startswith("session ")
    assert " · model claude-" in lines[0]
    assert lines[1:] == [
        "error (authentication_failed): Not logged in · Please run /login",
        "result: error: Not logged in · Please run /login · 1 turn · 0.3s · $0.0000",
    ]


def test_a_codex_session_reads_as_text() -> None:
    assert render(log_of("codex-session")).splitlines() == [
        "session 0199a213-81c0-7800-8aa1-bbab2a035a53",
        "(thinking) **Looking for the failing test**",
        "$ bash -lc 'pytest -x -q'  (exit 1)",
        "  F",
        "  E   ValueError: empty input",
        "  FAILED tests/test_parse.py::test_parse_empty",
        "  … (3 more lines)",
        "edited /srv/app/parse.py (update)",
        "edited /srv/app/tests/test_new.py (add)",
        "→ docs.search (completed)",
        "search: python parse empty string",
        "[x] fix parse",
        "[ ] add a test",
        "Fixed the empty-input case in parse.py and added a test.",
        "turn completed · input tokens 1200, cached 200, output tokens 345",
    ]


def test_codex_errors_and_stderr_read_as_text() -> None:
    lines = render(log_of("codex-no-network")).splitlines()
    assert lines[0] == "session 01a23238-afbb-73c2-85f4-6dda00704c79"
    assert lines[1].startswith("error: Reconnecting... 2/5 (stream disconnected")
    assert lines[5].startswith("warning: Falling back from WebSockets to HTTPS transport.")
    assert lines[7] == (
        "error: Reconnecting... waiting for network (Connection failed: error sending request)"
    )
    assert lines[8].endswith(
        "ERROR codex_api::endpoint::responses_websocket: failed to connect"
        " to Responses WebSocket stage=Unknown"
    )
    failed = render(log_of("codex-turn-failed")).splitlines()
    assert failed[-1].startswith("turn failed: You've hit your usage limit.")
    # No event at all: the log is shown as recorded.
    assert render(log_of("codex-untrusted-dir")) == log_of("codex-untrusted-dir").decode()


def test_malformed_and_truncated_streams_are_shown_not_lost() -> None:
    assert render(log_of("claude-malformed")).splitlines() == [
        "Welcome to Claude Code!",
        "session 9d8c7b6a-0000-4000-8000-000000000001 · model claude-sonnet-4-5",
        '[assistant] {"type": "assistant", "message": [1, 2]}',
        '[assistant] {"type":"assistant","message":{"content":"not a list"}}',
        "← tool: (no output)",
        "[1, 2, 3]",
        "result: error (error_max_turns): Reached maximum number of turns (30)",
        "{not json at all",
    ]
    truncated = render(log_of("claude-api-retry-truncated")).splitlines()
    assert truncated[1:3] == [
        "API retry 1/10: server_error (HTTP 529)",
        "API retry 2/10: server_error (HTTP 529)",
    ]
    # The line cut mid-way is shown as recorded.
    assert truncated[3].endswith('"text":"Looking at the')


@given(st.lists(st.integers(min_value=0, max_value=4000), max_size=12))
def test_a_log_read_in_any_chunks_reads_the_same(cuts: list[int]) -> None:
    data = log_of("claude-tools") + log_of("codex-session")
    points = sorted({min(cut, len(data)) for cut in cuts})
    text = LogText()
    shown = ""
    for start, end in zip([0, *points], [*points, len(data)], strict=True):
        shown += text.feed(data[start:end])
    assert shown + text.finish() == render(data)
