"""How a process outcome becomes the ledger's finish: every outcome, its status by value."""

from __future__ import annotations

import pytest

from herdsman.runtime.runner import Outcome, ProcessOutcome
from herdsman.runtime.runner.run_usage import RunUsage, Tokens
from herdsman.runtime.store import RunEnd, RunStatus
from herdsman.runtime.supervisor import finish_fields


@pytest.mark.parametrize("status", list(Outcome))
def test_each_outcome_finishes_as_the_run_status_of_its_value(status: Outcome) -> None:
    ended = ProcessOutcome(
        status=status,
        exit_code=3,
        reason="why\0",
        limit=None,
        result="done",
        session_id="s",
        excerpt="tail",
        usage_limit=None,
        usage=RunUsage(tokens=Tokens(input=5, output=2), cost_usd=0.01),
    )
    end = finish_fields(ended, "/logs/r.log")
    assert type(end.status) is RunStatus
    assert end.status.value == status.value
    assert end == RunEnd(
        end.status,
        exit_code=3,
        reason="why\ufffd",
        result="done",
        session_id="s",
        excerpt="tail",
        log_path="/logs/r.log",
        usage=ended.usage,
    )


def test_no_outcome_is_a_shutdown_cancel() -> None:
    assert finish_fields(None, "/logs/r.log") == RunEnd(
        RunStatus.CANCELLED, reason="supervisor shut down", log_path="/logs/r.log"
    )
