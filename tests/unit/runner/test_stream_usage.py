"""What each run spent and what the provider said, read from the recorded and written streams.

The streams are in tests/fixtures/agent_streams; its README says which were
recorded from the real CLIs (some against a local stand-in of the API) and
which were written by hand in the shapes the CLIs print.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.runner import (
    ApiFailure,
    ApiRetry,
    ModelUsage,
    ProtocolAdapter,
    RateLimitWarning,
    RunUsage,
    Tokens,
    make_adapter,
)
from herdsman.runtime.runner.api_failure import failure_of_status, failure_of_text
from herdsman.runtime.runner.protocols import LogText
from herdsman.runtime.runner.spec import Outcome

STREAMS = Path(__file__).resolve().parents[2] / "fixtures" / "agent_streams"
NOW = 1_775_000_000.0


def read(name: str) -> ProtocolAdapter:
    """The adapter of the stream's protocol, fed its recorded stdout and stderr."""
    adapter = make_adapter(name.split("-", maxsplit=1)[0], now=lambda: NOW)
    for line in (STREAMS / f"{name}.stdout").read_bytes().splitlines(keepends=True):
        adapter.feed_line(line)
    stderr = STREAMS / f"{name}.stderr"
    for line in (stderr.read_bytes() if stderr.exists() else b"").splitlines(keepends=True):
        adapter.feed_stderr_line(line)
    return adapter


def usage_of(name: str) -> RunUsage | None:
    return read(name).usage


# -- Claude Code ------------------------------------------------------------------------


def test_a_recorded_claude_run_reports_its_tokens_cost_model_and_time() -> None:
    # Recorded from Claude Code 2.1.197 against a stand-in API that answered once.
    tokens = Tokens(input=1234, cache_read=4096, cache_write=2048, output=56)
    assert usage_of("claude-standin-success") == RunUsage(
        tokens=tokens,
        cost_usd=0.022418,
        models=(ModelUsage(model="claude-opus-4-8[1m]", tokens=tokens, cost_usd=0.022418),),
        turns=1,
        duration=0.113,
        api_time=0.028,
        terminal_reason="completed",
    )
    assert tokens.total == 1234 + 4096 + 2048 + 56


def test_claude_usage_per_model_a_warning_and_a_retry_it_recovered_from() -> None:
    usage = usage_of("claude-usage-warning")
    assert usage is not None
    assert usage.tokens == Tokens(input=1500, cache_read=20000, cache_write=5000, output=2100)
    assert usage.cost_usd == 0.31925
    assert usage.models == (  # sorted by name, whatever the stream's order
        ModelUsage(
            model="claude-haiku-4-5", tokens=Tokens(input=300, output=100), cost_usd=0.00925
        ),
        ModelUsage(
            model="claude-opus-4-8",
            tokens=Tokens(input=1200, cache_read=20000, cache_write=5000, output=2000),
            cost_usd=0.31,
        ),
    )
    assert (usage.turns, usage.duration, usage.api_time) == (4, 48.21, 39.875)
    # The last rate-limit event warned (an earlier one allowed): near the weekly limit.
    assert usage.near_limit == RateLimitWarning(
        resets_at=1775559600.0, limit_type="seven_day", utilization=0.91
    )
    # A 429 was retried and the API answered after it: no failure, one retry kept.
    assert usage.failure is None
    assert usage.retries == 1
    assert usage.last_retry == ApiRetry(
        attempt=1, max_retries=10, delay=1.0, status=429, failure=ApiFailure.RATE_LIMIT
    )


def lines_of(name: str) -> list[bytes]:
    return (STREAMS / f"{name}.stdout").read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize(
    ("name", "kept"), [("claude-usage-warning", 6), ("codex-usage-resumed", 7)]
)
def test_a_failure_the_api_recovered_from_is_none_in_a_run_stopped_later(
    name: str, kept: int
) -> None:
    # Stopped (a limit, a cancel) after the API answered again: its earlier
    # errors were retried away and are not what the run ended with.
    adapter = make_adapter(name.split("-", maxsplit=1)[0])
    for line in lines_of(name)[:kept]:
        adapter.feed_line(line)
    usage = adapter.usage
    assert usage is not None
    assert usage.retries > 0
    assert usage.failure is None


def test_a_later_allowed_event_lifts_the_warning() -> None:
    adapter = make_adapter("claude")
    for status in ("allowed_warning", "allowed"):
        info = {"status": status, "resetsAt": 1775559600, "rateLimitType": "five_hour"}
        adapter.feed_line(
            json.dumps({"type": "rate_limit_event", "rate_limit_info": info}).encode()
        )
    assert adapter.usage is None


def test_claude_not_logged_in_needs_a_login() -> None:
    # Recorded from the real CLI without a login: its assistant error says so.
    usage = usage_of("claude-not-logged-in")
    assert usage is not None
    assert usage.failure is ApiFailure.AUTHENTICATION
    assert usage.needs_login
    assert usage.tokens == Tokens()
    assert usage.cost_usd == 0.0


def test_claude_refused_credentials_retried_need_a_login_too() -> None:
    # Recorded against a stand-in answering 401, stopped by `timeout` mid-retries.
    usage = usage_of("claude-standin-unauthorized")
    assert usage is not None
    assert usage.needs_login
    assert usage.tokens is None
    assert usage.retries == 7
    assert usage.last_retry is not None
    assert (usage.last_retry.attempt, usage.last_retry.max_retries) == (7, 10)
    assert usage.last_retry.status == 401


def test_claude_overloaded_is_its_own_class_though_its_last_message_says_server_error() -> None:
    # Recorded against a stand-in answering 529: two api_retry lines say
    # "overloaded", the closing assistant message "server_error".
    adapter = read("claude-standin-overloaded")
    usage = adapter.usage
    assert usage is not None
    assert usage.failure is ApiFailure.OVERLOADED
    assert usage.retries == 2
    # A result whose subtype says success with is_error true failed.
    assert adapter.verdict(1).status is Outcome.FAILED


def test_a_529_named_server_error_in_a_retry_is_overloaded() -> None:
    usage = usage_of("claude-api-retry-truncated")
    assert usage is not None
    assert usage.failure is ApiFailure.OVERLOADED
    assert usage.last_retry == ApiRetry(
        attempt=2, max_retries=10, delay=1.2, status=529, failure=ApiFailure.OVERLOADED
    )


def test_claude_rate_limited_without_a_reset_is_a_rate_limit() -> None:
    usage = usage_of("claude-standin-rate-limited")
    assert usage is not None
    assert usage.failure is ApiFailure.RATE_LIMIT
    assert usage.retries == 7


def test_a_billing_error_keeps_its_class_over_the_results_http_status() -> None:
    usage = usage_of("claude-billing-error")
    assert usage is not None
    assert usage.failure is ApiFailure.BILLING
    assert not usage.needs_login


def test_a_claude_stream_cut_before_its_result_counts_the_messages_seen() -> None:
    adapter = read("claude-usage-truncated")
    usage = adapter.usage
    assert usage is not None
    # msg_31 twice (its last usage counts), msg_32 once; the cut result line is lost.
    tokens = Tokens(input=30, cache_read=4000, cache_write=4000, output=128)
    assert usage.tokens == tokens
    assert usage.partial
    assert usage.cost_usd is None
    assert usage.models == (ModelUsage(model="claude-opus-4-8", tokens=tokens),)
    # The retry after the last answer had no status: no answer came at all.
    assert usage.failure is ApiFailure.CONNECTION
    assert adapter.verdict(1).status is Outcome.FAILED


def test_malformed_claude_fields_are_left_out_and_the_run_still_succeeds() -> None:
    adapter = read("claude-usage-malformed")
    assert adapter.verdict(0).status is Outcome.SUCCEEDED
    assert adapter.usage == RunUsage(
        tokens=Tokens(input=12),  # 12.0 is a count; "9", null and false are not
        models=(ModelUsage(model="claude-sonnet-4-5", tokens=Tokens(output=4), cost_usd=None),),
        near_limit=RateLimitWarning(resets_at=None, limit_type=None, utilization=None),
        retries=1,
        last_retry=ApiRetry(
            attempt=None, max_retries=None, delay=None, status=None, failure=ApiFailure.CONNECTION
        ),
    )


def assistant_error(error: str, text: str) -> dict[str, object]:
    content = [{"type": "text", "text": text}]
    message = {"model": "<synthetic>", "content": content, "usage": {"input_tokens": 0}}
    return {"type": "assistant", "message": message, "error": error}


def error_result(**fields: object) -> dict[str, object]:
    return {"type": "result", "subtype": "success", "is_error": True, **fields}


@pytest.mark.parametrize(
    ("events", "failure"),
    [
        # No class named before: the result's HTTP status says it.
        ([error_result(api_error_status=529, result="API Error")], ApiFailure.OVERLOADED),
        # Nor a status: the result's own "API Error" text.
        ([error_result(result="API Error: Connection error.")], ApiFailure.CONNECTION),
        # Claude Code's "unknown" is classed by its text.
        (
            [assistant_error("unknown", "API Error: 500 Internal server error"), error_result()],
            ApiFailure.SERVER_ERROR,
        ),
        # An error that is not the API's (the reply was cut at its limit) has no class.
        ([assistant_error("max_output_tokens", "Response cut"), error_result()], None),
        # An error result that is not about the API (too many turns) has none either.
        ([error_result(subtype="error_max_turns", result="Reached maximum number of turns")], None),
    ],
)
def test_claude_failure_classes_from_the_result_and_messages(
    events: list[dict[str, object]], failure: ApiFailure | None
) -> None:
    adapter = make_adapter("claude")
    for event in events:
        adapter.feed_line(json.dumps(event).encode() + b"\n")
    usage = adapter.usage
    assert (usage.failure if usage is not None else None) is failure
    assert adapter.verdict(1).status is Outcome.FAILED


def test_a_claude_stream_without_figures_has_no_usage() -> None:
    # The demo agent's older result line, and a stream of only an init line.
    adapter = make_adapter("claude")
    adapter.feed_line(b'{"type":"system","subtype":"init","session_id":"s"}\n')
    adapter.feed_line(b'{"type":"result","subtype":"success","is_error":false,"result":"ok"}\n')
    assert adapter.usage is None
    assert adapter.verdict(0).status is Outcome.SUCCEEDED


# -- Codex ------------------------------------------------------------------------------


def test_a_recorded_codex_run_reports_its_session_tokens() -> None:
    # Recorded from codex-cli 0.171.0 against a stand-in API that answered once:
    # 5120 input of which 4096 cached, 77 output of which 64 reasoning.
    assert usage_of("codex-standin-success") == RunUsage(
        tokens=Tokens(input=1024, cache_read=4096, cache_write=0, output=77, reasoning=64),
        turns=1,
        session_totals=True,
    )


def test_codex_counts_are_session_totals_the_last_turn_counts_not_their_sum() -> None:
    usage = usage_of("codex-usage-resumed")
    assert usage is not None
    assert usage.tokens == Tokens(
        input=3000, cache_read=26000, cache_write=2000, output=1300, reasoning=700
    )
    assert usage.turns == 2
    assert usage.session_totals
    # Two reconnects, then the turn completed: retried, not failed.
    assert usage.failure is None
    assert usage.retries == 2
    assert usage.last_retry == ApiRetry(
        attempt=2, max_retries=5, delay=None, status=503, failure=ApiFailure.SERVER_ERROR
    )


@pytest.mark.parametrize(
    ("name", "failure", "retries"),
    [
        ("codex-standin-unauthorized", ApiFailure.AUTHENTICATION, 5),
        ("codex-standin-server-error", ApiFailure.SERVER_ERROR, 5),
        ("codex-no-network", ApiFailure.CONNECTION, 6),
    ],
)
def test_a_failed_codex_run_names_its_class(name: str, failure: ApiFailure, retries: int) -> None:
    usage = usage_of(name)
    assert usage is not None
    assert usage.failure is failure
    assert usage.retries == retries
    assert usage.tokens is None


def test_a_codex_usage_limit_is_a_usage_limit_and_no_failure_class() -> None:
    # Recorded: Codex turns a 429 usage_limit_reached into English, with a local time.
    adapter = read("codex-standin-usage-limit")
    assert adapter.usage is None
    limit = adapter.usage_limit
    assert limit is not None
    assert limit.resets_at is not None
    assert limit.message.startswith("You\u2019ve hit your usage limit.")


def test_malformed_codex_fields_are_left_out() -> None:
    adapter = read("codex-usage-malformed")
    assert adapter.verdict(0).status is Outcome.FAILED  # the turn.failed at the end
    assert adapter.usage == RunUsage(
        # The last turn.completed with a count: 100 input, 400 cached (more than
        # the input: nothing fresh), output 7.5 not a count.
        tokens=Tokens(input=0, cache_read=400),
        turns=3,
        session_totals=True,
        failure=ApiFailure.OTHER,  # turn.failed without a message
        retries=1,
        last_retry=ApiRetry(
            attempt=None, max_retries=None, delay=None, status=None, failure=ApiFailure.OTHER
        ),
    )


def test_a_plain_cli_reports_no_usage() -> None:
    adapter = make_adapter("plain")
    adapter.feed_line(b'{"type":"result","total_cost_usd":1.0}\n')
    assert adapter.usage is None


# -- Never a crash ----------------------------------------------------------------------

RECORDED = sorted(path.stem for path in STREAMS.glob("*.stdout"))


@pytest.mark.parametrize("name", RECORDED)
def test_every_cut_of_a_stream_reads_without_error(name: str) -> None:
    # A stream may end anywhere (a killed agent, a full disk): every prefix of
    # every line is read, and the verdict and usage are still given.
    data = (STREAMS / f"{name}.stdout").read_bytes()
    lines = data.splitlines(keepends=True)
    for index, line in enumerate(lines):
        for cut in range(0, len(line), max(1, len(line) // 40)):
            adapter = make_adapter(name.split("-", maxsplit=1)[0], now=lambda: NOW)
            for whole in lines[:index]:
                adapter.feed_line(whole)
            adapter.feed_line(line[:cut])
            adapter.verdict(1)
            usage = adapter.usage
            assert usage is None or not usage.empty


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
KEYS = st.sampled_from(
    [
        "usage",
        "modelUsage",
        "total_cost_usd",
        "num_turns",
        "duration_ms",
        "duration_api_ms",
        "is_error",
        "api_error_status",
        "result",
        "rate_limit_info",
        "attempt",
        "error_status",
        "retry_delay_ms",
        "error",
        "message",
        "subtype",
    ]
)
EVENT = st.builds(
    lambda kind, fields: {"type": kind, **fields},
    st.sampled_from(
        [
            "result",
            "assistant",
            "rate_limit_event",
            "system",
            "turn.completed",
            "turn.failed",
            "error",
            "item.completed",
        ]
    ),
    st.dictionaries(KEYS, JSON, max_size=5),
)


@given(st.lists(EVENT, max_size=6), st.sampled_from(["claude", "codex"]))
def test_events_of_any_shape_never_break_a_run(
    events: list[dict[str, object]], protocol: str
) -> None:
    adapter = make_adapter(protocol, now=lambda: NOW)
    for event in events:
        adapter.feed_line(json.dumps(event).encode() + b"\n")
    adapter.verdict(0)
    usage = adapter.usage
    if usage is not None:
        counts = [] if usage.tokens is None else [usage.tokens.total, usage.tokens.reasoning]
        assert all(number >= 0 for number in counts)
        assert usage.cost_usd is None or usage.cost_usd >= 0


# -- In `herdsman logs` ----------------------------------------------------------------


def render(name: str) -> list[str]:
    text = LogText()
    data = (STREAMS / f"{name}.stdout").read_bytes()
    return (text.feed(data) + text.finish()).splitlines()


def test_the_log_shows_a_claude_runs_tokens_per_model_and_its_warning() -> None:
    lines = render("claude-usage-warning")
    assert lines[3].startswith("rate limit allowed_warning (seven_day), 91% used, resets ")
    assert lines[5:] == [
        "result: success · 4 turns · 48.2s · $0.3192",
        "tokens: 1,500 input · 20,000 cache read · 5,000 cache write · 2,100 output · API 39.9s",
        "  claude-haiku-4-5: 300 input · 100 output · $0.0092",
        "  claude-opus-4-8: 1,200 input · 20,000 cache read · 5,000 cache write · 2,000 output"
        " · $0.3100",
    ]


def test_the_log_shows_codex_cache_writes_and_reasoning() -> None:
    assert render("codex-usage-resumed")[-1] == (
        "turn completed · input tokens 31000, cached 26000, cache write 2000,"
        " output tokens 1300, reasoning 700"
    )


def test_the_log_shows_no_token_line_for_a_run_that_spent_none() -> None:
    # Not logged in: every count is zero.
    assert not any(line.startswith("tokens:") for line in render("claude-not-logged-in"))


@pytest.mark.parametrize("name", RECORDED)
def test_every_stream_renders_without_error(name: str) -> None:
    lines = render(name)
    if name == "claude-usage-malformed":
        # Counts that cannot be read are left out of the line, not shown wrong.
        assert "tokens: 12 input" in lines
    assert lines or not (STREAMS / f"{name}.stdout").read_bytes()


# -- The classes of failure -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "failure"),
    [
        ("unexpected status 401 Unauthorized: Incorrect API key provided", "authentication_failed"),
        (
            "We\u2019re currently experiencing high demand, which may cause temporary errors.",
            "server_error",
        ),
        ("API Error: Repeated 529 Overloaded errors. The API is at capacity", "overloaded"),
        ("stream disconnected before completion: error sending request", "connection"),
        ("exceeded retry limit, last status: 429 Too Many Requests", "rate_limit"),
        ("Your credit balance is too low; billing", "billing_error"),
        ("something else went wrong", "api_error"),
    ],
)
def test_a_providers_message_names_its_class(text: str, failure: str) -> None:
    assert failure_of_text(text) == failure


def test_a_usage_limit_message_has_no_failure_class() -> None:
    assert failure_of_text("You've hit your usage limit. Try again at 8:15 PM.") is None
    assert failure_of_text("You've hit your limit · resets 8pm (Europe/Berlin)") is None


@pytest.mark.parametrize(
    ("status", "failure"),
    [
        (529, "overloaded"),
        (503, "server_error"),
        (429, "rate_limit"),
        (403, "authentication_failed"),
        (402, "billing_error"),
        (413, "invalid_request"),
        (418, "api_error"),
    ],
)
def test_an_http_status_names_its_class(status: int, failure: str) -> None:
    assert failure_of_status(status) == failure


@pytest.mark.parametrize(
    ("name", "third_retry"),
    [("claude-standin-unauthorized", 3), ("codex-standin-unauthorized", 4)],
)
def test_a_login_refused_on_the_third_retry_is_an_auth_failure_then(
    name: str, third_retry: int
) -> None:
    adapter = make_adapter(name.split("-", maxsplit=1)[0], now=lambda: NOW)
    lines = (STREAMS / f"{name}.stdout").read_bytes().splitlines(keepends=True)
    for index, line in enumerate(lines):
        adapter.feed_line(line)
        # One refusal may precede a login refreshed meanwhile: only the third stops the run.
        assert (adapter.auth_failure is not None) is (index >= third_retry), index
    assert adapter.auth_failure is not None
    assert "3/" in adapter.auth_failure


def test_retries_of_other_failures_are_no_auth_failure() -> None:
    for name in ("claude-standin-rate-limited", "claude-standin-overloaded", "codex-no-network"):
        assert read(name).auth_failure is None, name
