"""What the supervisor traces of an attempt's end reads back to the same end in a replay.

A real process's end (its stream's spend, API failure, warning, refused
login, work and session) goes through the supervisor's own reading
(``run_outcome``) and the real trace writer; the trace line, read back by
the replay (``recorded_end``) and reported by its fake runner
(``fake_end``), must make production's reading say the same: the retry
class, whether work was done, the session, the spend charged and the
account's signals.
"""

from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_workloads import herdsman

from herdsman.core.outcome import Outcome
from herdsman.core.retry import Failure
from herdsman.runtime.runner import ApiFailure, ProcessOutcome
from herdsman.runtime.runner.run_usage import RateLimitWarning, RunUsage, Tokens
from herdsman.runtime.store.records import spend_json, spend_of
from herdsman.runtime.supervisor.outcomes import run_outcome
from herdsman.sim.fake_end import fake_end
from herdsman.sim.recorded_end import API_OF_CLASS, Signals, recorded_end
from herdsman.sim.workload import Attempt
from herdsman.trace import TraceWriter

#: How a real attempt failing of each class ends: its status, exit code, the
#: runner's limit and the API failure its stream named. Billing and a refused
#: request have no retry class: no policy retries them.
ENDS: dict[str, tuple[Outcome, int, str | None, ApiFailure | None]] = {
    **{failure.value: (Outcome.FAILED, 1, None, api) for failure, api in API_OF_CLASS.items()},
    "crash": (Outcome.FAILED, 3, None, None),
    "idle_timeout": (Outcome.TIMED_OUT, -15, "idle_timeout", None),
    "billing": (Outcome.FAILED, 1, None, ApiFailure.BILLING),
    "refused request": (Outcome.FAILED, 1, None, ApiFailure.INVALID_REQUEST),
    "success": (Outcome.SUCCEEDED, 0, None, None),
}

tokens = st.builds(
    Tokens,
    input=st.integers(0, 10**6),
    cache_read=st.integers(0, 10**6),
    cache_write=st.integers(0, 10**6),
    output=st.integers(0, 10**6),
    reasoning=st.integers(0, 10**3),
)


def traced_finish(ended: ProcessOutcome, session: bool) -> dict[str, Any]:
    """The finish line the supervisor's trace writer writes for ``ended``, read as JSON."""
    outcome = run_outcome(ended, session)
    out = io.StringIO()
    writer = TraceWriter(
        Path("/unused"),
        max_bytes=1 << 40,
        sink=out,
        config={},
        clock=lambda: 1.0,
        wall=lambda: dt.datetime(2026, 12, 1, tzinfo=dt.UTC),
    )
    writer.open()
    spend = spend_of(ended.usage)
    writer.finish(
        "r1",
        ended.status.value,
        ended.exit_code,
        requeued=False,
        spend=None if spend is None else spend_json(spend),
        failure=outcome.failure,
        worked=outcome.failure is not None and outcome.worked,
        session=outcome.session,
    )
    fields: dict[str, Any] = json.loads(out.getvalue().splitlines()[-1])
    return fields


@given(
    failure=st.sampled_from([*ENDS]),
    worked=st.booleans(),
    session=st.booleans(),
    spent=st.none() | tokens,
    cost=st.none() | st.floats(0, 100, allow_nan=False),
    warned=st.none() | st.floats(1.7e9, 1.9e9),
    login=st.booleans(),
)
def test_a_traced_end_reads_back_to_the_same_reading(  # noqa: PLR0917 (hypothesis draws)
    failure: str,
    worked: bool,
    session: bool,
    spent: Tokens | None,
    cost: float | None,
    warned: float | None,
    login: bool,
) -> None:
    status, exit_code, limit, api = ENDS[failure]
    if login:
        status, exit_code, limit, api = Outcome.FAILED, 1, None, ApiFailure.AUTHENTICATION
    usage = RunUsage(
        tokens=spent,
        cost_usd=cost,
        near_limit=None if warned is None else RateLimitWarning(warned, "five_hour"),
        failure=api,
    )
    ended = ProcessOutcome(
        status=status,
        exit_code=exit_code,
        reason="claude reported an error (authentication_failed): Not logged in"
        if login
        else "failed",
        limit=limit,
        result=None,
        session_id="s1" if session else None,
        excerpt="",
        usage_limit=None,
        usage=None if usage.empty else usage,
        worked=worked,
    )
    expected = run_outcome(ended, session)
    said = Signals(
        warned_until=warned,
        login=None
        if expected.account is None or expected.account.needs_login is None
        else expected.account.needs_login,
    )
    fields = traced_finish(ended, session)
    back = recorded_end("t:2", fields, said)
    attempt = Attempt(
        1.0,
        back.outcome,
        fields["exit_code"],
        usage=back.usage,
        limit=back.limit,
        reported=back.reported,
    )
    replayed = fake_end(attempt, None)
    again = run_outcome(replayed, replayed.session_id is not None)
    assert (again.status, again.exit_code, again.failure, again.session) == (
        expected.status,
        expected.exit_code,
        expected.failure,
        expected.session,
    )
    # Work matters only to a failure a policy may retry.
    assert expected.failure is None or again.worked == expected.worked
    assert again.account == expected.account


def test_a_finish_naming_an_unknown_failure_class_is_refused_naming_its_line(
    tmp_path: Path,
) -> None:
    recorded = Path(__file__).parents[2] / "sim" / "demo-recorded.jsonl"
    lines = recorded.read_text().splitlines()
    at = next(n for n, line in enumerate(lines) if '"event":"finish"' in line)
    event = json.loads(lines[at])
    event["outcome"], event["failure"] = "failed", "overload"
    lines[at] = json.dumps(event)
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    done = herdsman("sim", "replay", "bad.jsonl", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"herdsman: bad.jsonl:{at + 1}: failure: expected one of overloaded, server_error,"
        " rate_limit, connection, api_error, idle_timeout, crash, got 'overload'"
    ]


@pytest.mark.parametrize("failure", [f.value for f in Failure])
def test_every_retry_class_a_finish_names_reads_back_as_that_class(failure: str) -> None:
    exit_code = -15 if failure == "idle_timeout" else 1
    outcome = "timed_out" if failure == "idle_timeout" else "failed"
    fields = {"run_id": "r", "outcome": outcome, "exit_code": exit_code, "failure": failure}
    back = recorded_end("t:2", fields, Signals())
    attempt = Attempt(1.0, back.outcome, exit_code, usage=back.usage, limit=back.limit)
    assert run_outcome(fake_end(attempt, None), False).failure == Failure(failure)
