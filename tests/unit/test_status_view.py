"""The status views are built from read-only queries: a lifecycle alone gives them."""

from __future__ import annotations

from herdsman.core import Limits, RunRequest
from herdsman.core.accounts import AccountSpec
from herdsman.core.lifecycle import Lifecycle, Settings
from herdsman.core.outcome import Outcome, RunOutcome, UsageLimit
from herdsman.runtime import status_view


def test_a_resting_account_and_a_removed_provider_are_why_runs_wait() -> None:
    life = Lifecycle(Settings(Limits({"p": 2, "gone": 1}), accounts={"p": (AccountSpec("a"),)}))
    for run_id, provider in (("r1", "p"), ("r2", "p"), ("r3", "gone")):
        life.submit(RunRequest(run_id, provider), 100.0)
    assert list(life.take_starts(100.0)) == ["r1", "r2"]
    limited = RunOutcome(Outcome.FAILED, 1, UsageLimit(500.0, "out of quota"))
    settled = life.finish("r1", limited, 110.0)
    life.settle("r1", 110.0, requeued=settled.requeue)
    before = status_view.status(
        life,
        now=120.0,
        oldest_submitted_at=100.0,
        generation=3,
        lost_at_startup=0,
        providers=("p",),
        last_reload=None,
        waiting_for_restart=(),
    )
    assert (before["running"], before["queued"], before["generation"]) == (1, 2, 3)
    assert before["oldest_queued_age"] == 20.0
    resting = {"reason": "a: usage limit reached", "until": 500.0}
    assert before["waiting_for_accounts"] == {"p": resting}
    assert list(before["waiting_for_provider"]) == ["gone"]
    [account] = before["accounts"]
    assert (account["account"], account["exhausted_until"]) == ("a", 500.0)
    # Asking changed nothing: the same view again, and the same starts.
    assert status_view.waiting_for_accounts(life, 120.0) == before["waiting_for_accounts"]
    assert list(life.take_starts(500.0)) == ["r1"]
