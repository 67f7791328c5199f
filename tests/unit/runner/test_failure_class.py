"""The retry class and the "did work" flag of the recorded streams, as the runner reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from herdsman.core.outcome import Outcome
from herdsman.core.retry import Failure
from herdsman.runtime.runner.failure_class import failure_of
from herdsman.runtime.runner.process import ended_by_itself
from herdsman.runtime.runner.protocols.base import ProtocolAdapter
from herdsman.runtime.runner.protocols.claude import ClaudeAdapter
from herdsman.runtime.runner.protocols.codex import CodexAdapter
from herdsman.runtime.runner.protocols.plain import PlainAdapter
from herdsman.runtime.runner.spec import ProcessOutcome, not_started

STREAMS = Path(__file__).parents[2] / "fixtures" / "agent_streams"


def read(name: str, exit_code: int) -> ProcessOutcome:
    """The outcome of a process that printed the fixture ``name`` and exited with ``exit_code``."""
    adapter: ProtocolAdapter = ClaudeAdapter() if name.startswith("claude") else CodexAdapter()
    for line in (STREAMS / f"{name}.stdout").read_bytes().splitlines(keepends=True):
        adapter.feed_line(line)
    stderr = STREAMS / f"{name}.stderr"
    if stderr.exists():
        for line in stderr.read_bytes().splitlines(keepends=True):
            adapter.feed_stderr_line(line)
    return ended_by_itself(adapter, exit_code, "")


@pytest.mark.parametrize(
    ("name", "exit_code", "failure", "worked"),
    [
        ("claude-standin-overloaded", 1, Failure.OVERLOADED, False),
        ("claude-standin-rate-limited", 124, Failure.RATE_LIMIT, False),
        ("claude-api-retry-truncated", 1, Failure.OVERLOADED, False),
        ("claude-usage-truncated", 1, Failure.CONNECTION, True),
        ("claude-malformed", 1, Failure.CRASH, False),
        ("codex-standin-server-error", 1, Failure.SERVER_ERROR, False),
        ("codex-no-network", 124, Failure.CONNECTION, False),
        ("codex-usage-malformed", 1, Failure.API_ERROR, True),
        ("codex-untrusted-dir", 1, Failure.CRASH, False),
        # Never retried: a login, billing, a usage limit (the account rests instead).
        ("claude-not-logged-in", 1, None, False),
        ("claude-standin-unauthorized", 124, None, False),
        ("claude-billing-error", 1, None, False),
        ("codex-standin-unauthorized", 1, None, False),
        ("codex-standin-usage-limit", 1, None, False),
        ("codex-turn-failed", 1, None, False),
        # Succeeded: no class. A tool call or a completed turn is work.
        ("claude-standin-success", 0, None, False),
        ("claude-tools", 0, None, True),
        ("codex-standin-success", 0, None, True),
        ("codex-session", 0, None, True),
    ],
)
def test_each_recorded_stream_has_its_class_and_says_whether_the_agent_worked(
    name: str, exit_code: int, failure: Failure | None, worked: bool
) -> None:
    ended = read(name, exit_code)
    assert (failure_of(ended), ended.worked) == (failure, worked)


def test_only_the_idle_timeout_of_the_two_limits_has_a_class() -> None:
    ended = read("claude-standin-overloaded", -15)
    idle = ProcessOutcome(Outcome.TIMED_OUT, -15, "idle", "idle_timeout", None, None, "", None)
    wall = ProcessOutcome(Outcome.TIMED_OUT, -15, "wall", "timeout", None, None, "", None)
    assert failure_of(idle) is Failure.IDLE_TIMEOUT
    assert failure_of(wall) is None
    cancelled = ProcessOutcome(Outcome.CANCELLED, -15, "asked", None, None, None, "", None)
    assert failure_of(cancelled) is None
    assert failure_of(not_started(Outcome.FAILED, "no such program")) is None
    assert ended.usage is not None


def test_a_plain_cli_that_printed_anything_may_have_worked() -> None:
    silent, talking = PlainAdapter(), PlainAdapter()
    silent.feed_line(b"\n")
    talking.feed_line(b"editing main.py\n")
    assert (silent.worked, talking.worked) == (False, True)
