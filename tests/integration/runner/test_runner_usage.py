"""A run's outcome carries what it spent, read from a real process's stream, stopped or not."""

from __future__ import annotations

import os
from pathlib import Path

import trio
from runner_helpers import STREAMS, demo, make_spec, replay, run_into

from herdsman.runtime.runner import (
    ApiFailure,
    ProcessOutcome,
    RunCancel,
    Tokens,
    execute,
    make_adapter,
)
from herdsman.runtime.runner.spec import Outcome


def expected(name: str, protocol: str) -> object:
    """What the adapter reads from the stream fed in one go, as the unit tests do."""
    adapter = make_adapter(protocol)
    for line in (STREAMS / f"{name}.stdout").read_bytes().splitlines(keepends=True):
        adapter.feed_line(line)
    return adapter.usage


async def test_a_finished_run_carries_its_usage(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, argv=replay("claude-usage-warning", 0), protocol="claude")
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.usage == expected("claude-usage-warning", "claude")
    assert outcome.usage is not None
    assert outcome.usage.cost_usd == 0.31925
    assert outcome.usage.near_limit is not None


async def test_a_failed_codex_run_carries_its_failure_class(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, argv=replay("codex-standin-unauthorized", 1), protocol="codex")
    outcome = await execute(spec)
    assert outcome.status is Outcome.FAILED
    assert outcome.usage is not None
    assert outcome.usage.needs_login


async def test_a_cancelled_run_keeps_what_the_stream_said_it_spent(tmp_path: Path) -> None:
    # The agent wrote its messages, then hung: the cancel stops it, and the
    # tokens its messages reported are kept (a lower bound, no result line).
    name = "claude-usage-truncated"
    spec = make_spec(tmp_path, argv=replay(name, 0, then_sleep=60), protocol="claude")
    size = (STREAMS / f"{name}.stdout").stat().st_size
    outcomes: list[ProcessOutcome] = []
    cancel = RunCancel()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_into, outcomes, spec, cancel)
        while not (spec.log_path.exists() and spec.log_path.stat().st_size >= size):
            await trio.sleep(0.01)
        cancel.cancel("enough")
    [outcome] = outcomes
    assert outcome.status is Outcome.CANCELLED
    assert outcome.usage is not None
    assert outcome.usage.partial
    assert outcome.usage.tokens == Tokens(input=30, cache_read=4000, cache_write=4000, output=128)
    assert outcome.usage.failure is ApiFailure.CONNECTION


async def test_the_demo_agent_fails_its_first_attempts_as_an_overloaded_api(
    tmp_path: Path,
) -> None:
    """``--overloaded 2``: attempts 1 and 2 are a 529 the retry rule classes as such; 3 succeeds."""
    from herdsman.core.retry import Failure
    from herdsman.runtime.runner.failure_class import failure_of

    argv = demo("--delay", "0", "--protocol", "claude", "--overloaded", "2")
    outcomes: list[ProcessOutcome] = []
    for attempt in ("1", "2", "3"):
        env = {"PATH": os.defpath, "LANG": "C.UTF-8", "HERDSMAN_ATTEMPT": attempt}
        spec = make_spec(tmp_path, argv=argv, protocol="claude", env=env)
        outcomes.append(await execute(spec))
    first, second, third = outcomes
    for failed in (first, second):
        assert (failed.status, failed.exit_code) == (Outcome.FAILED, 1)
        assert failed.usage is not None
        assert failed.usage.failure is ApiFailure.OVERLOADED
        assert failure_of(failed) is Failure.OVERLOADED
        assert not failed.worked
        # The prompt it read before the API failed: "and more\nsay hello", no reply.
        assert failed.usage.tokens == Tokens(input=5, output=1)
    assert third.status is Outcome.SUCCEEDED
    assert failure_of(third) is None


async def test_a_plain_run_has_no_usage(tmp_path: Path) -> None:
    outcome = await execute(make_spec(tmp_path))
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.usage is None


async def test_the_demo_agent_reports_what_it_spent_and_can_warn(tmp_path: Path) -> None:
    argv = demo("--delay", "0", "--protocol", "claude", "--rate-limit-warning")
    outcome = await execute(make_spec(tmp_path, argv=argv, protocol="claude"))
    assert outcome.status is Outcome.SUCCEEDED
    usage = outcome.usage
    assert usage is not None
    # 18 characters of prompt and 21 of reply, about four a token.
    assert usage.tokens == Tokens(input=5, output=6)
    assert usage.cost_usd == 0.000105
    assert [model.model for model in usage.models] == ["demo"]
    assert usage.near_limit is not None
    assert usage.near_limit.limit_type == "five_hour"


async def test_a_run_whose_login_is_refused_again_and_again_is_stopped_early(
    tmp_path: Path,
) -> None:
    # Recorded: Claude Code retrying a refused login (the real CLI goes on
    # for minutes); the stand-in then hangs as the CLI would, its wall-clock
    # limit far off. The third refused retry stops it.
    argv = replay("claude-standin-unauthorized", 124, then_sleep=600)
    spec = make_spec(tmp_path, argv=argv, protocol="claude", timeout=None)
    with trio.fail_after(60):
        outcome = await execute(spec)
    assert outcome.status is Outcome.FAILED
    assert outcome.limit is None
    assert outcome.reason == (
        "stopped early: the account is not logged in"
        " (API retry 3/10: authentication_failed (HTTP 401))"
    )
    assert outcome.usage is not None
    assert outcome.usage.needs_login
