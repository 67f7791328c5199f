"""What agents' streams say reaches the whole supervisor in a fuzz run, and the checks hold.

Scenarios written by hand (``herdsman.sim.fuzz.agent_faults`` documents the
attempt fields): transient failures before and after work under a retry
policy, a refused login and the operator's login, a warning, a budget in
tokens; and :class:`AccountChecks`' own arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from test_fuzz_faults import _events

from herdsman.sim.fuzz.account_checks import AccountChecks, AgentEnd
from herdsman.sim.fuzz.harness import LOGIN_AFTER, Verdict, run_scenario
from herdsman.sim.fuzz.scenario import (
    Scenario,
    ScenarioError,
    draw_scenario,
    scenario_from_json,
)

CONFIG = """\
[supervisor]
state_dir = "/herdsman-sim/state"
[scheduling]
agent_exclusive = false
[retention]
idle = "10m"
sweep_interval = "2m"
[providers.claude]
exec = ["claude"]
concurrency = 3
idle_timeout = "120s"
protocol = "claude"
[providers.claude.retry]
attempts = 3
on = ["overloaded", "crash", "idle_timeout"]
after_work = ["crash"]
backoff = "10s"
backoff_max = "20s"
"""

ACCOUNTS = """\
[[providers.claude.accounts]]
name = "a"
[[providers.claude.accounts]]
name = "b"
"""


def _submit(t: float, run_id: str, *attempts: dict[str, Any], **run: Any) -> dict[str, Any]:
    sent = {"id": run_id, "provider": "claude", "workspace": "default", **run}
    return {"t": t, "kind": "submit", "run": sent, "attempts": list(attempts)}


def _ok(duration: float = 30.0, **said: Any) -> dict[str, Any]:
    return {"duration": duration, "outcome": "succeeded", **said}


def _failed(failure: str, *, worked: bool = False, duration: float = 5.0) -> dict[str, Any]:
    outcome = "timed_out" if failure == "idle_timeout" else "failed"
    return {"duration": duration, "outcome": outcome, "failure": failure, "worked": worked}


def _run(*events: Mapping[str, Any], config: str = CONFIG) -> Verdict:
    verdict = run_scenario(Scenario(7, config, tuple(events)))
    assert verdict.violations == ()
    return verdict


def test_transient_failures_retry_as_the_policy_says_before_and_after_work() -> None:
    verdict = _run(
        _submit(0.0, "idle", _failed("overloaded"), _failed("idle_timeout", duration=120.0), _ok()),
        _submit(0.0, "worked", _failed("overloaded", worked=True), _ok()),
        _submit(0.0, "crashed", _failed("crash", worked=True), _ok()),
        _submit(0.0, "refused", _failed("server_error"), _ok()),
        _submit(0.0, "thrice", *[_failed("overloaded")] * 3, _ok()),
    )
    retries = [
        (e["run_id"], e["attempt"], e["failure"]) for e in _events(verdict) if e["event"] == "retry"
    ]
    assert sorted(retries) == [
        ("crashed", 1, "crash"),  # after work, but crash is in after_work
        ("idle", 1, "overloaded"),
        ("idle", 2, "idle_timeout"),
        ("thrice", 1, "overloaded"),
        ("thrice", 2, "overloaded"),  # the third attempt is the policy's last
    ]
    ends = {e["run_id"]: e["outcome"] for e in _events(verdict) if e["event"] == "finish"}
    assert ends == {
        "idle": "succeeded",
        "worked": "failed",
        "crashed": "succeeded",
        "refused": "failed",
        "thrice": "failed",
    }


def test_a_retried_run_keeps_its_conversation_s_lane() -> None:
    verdict = _run(
        _submit(0.0, "first", _failed("overloaded"), _ok(), conversation="c1"),
        _submit(1.0, "second", _ok(), conversation="c1"),
    )
    starts = [e["run_id"] for e in _events(verdict) if e["event"] == "start"]
    assert starts == ["first", "first", "second"]


def test_a_refused_login_holds_the_account_until_the_operator_logs_it_in() -> None:
    long = _ok(duration=1000.0)
    verdict = _run(
        _submit(0.0, "refused", _failed("authentication_failed"), _ok()),
        _submit(0.0, "busy", long),  # b is busy: after the move, a is the only one left
        _submit(20.0, "later", _ok()),
        config=CONFIG + ACCOUNTS.replace('name = "b"', 'name = "b"\nconcurrency = 1'),
    )
    events = _events(verdict)
    login = next(e for e in events if e["event"] == "needs_login")
    assert (login["run_id"], login["account"]) == ("refused", "a")
    # The operator ends the account's rest LOGIN_AFTER seconds on: runs may use it again.
    ended = next(e for e in events if e["event"] == "rest_ended")
    assert ended["t"] == pytest.approx(login["t"] + LOGIN_AFTER)
    later = next(e for e in events if e["event"] == "start" and e["run_id"] == "later")
    assert later["t"] >= ended["t"]
    assert later["account"] == "a"


def test_a_warning_sends_new_conversations_to_another_account() -> None:
    verdict = _run(
        _submit(0.0, "warned", _ok(duration=5.0, warning={"resets_in": 3600.0})),
        _submit(10.0, "next", _ok()),
        config=CONFIG + ACCOUNTS,
    )
    accounts = {e["run_id"]: e["account"] for e in _events(verdict) if e["event"] == "start"}
    assert accounts == {"warned": "a", "next": "b"}


def test_a_tokens_budget_holds_the_next_start_until_the_spend_leaves_the_window() -> None:
    spend = {"tokens": {"input": 15_000, "cache_read": 90_000, "output": 10_000}, "cost_usd": 0.3}
    config = CONFIG + (
        '[[providers.claude.accounts]]\nname = "a"\nwindow = "300s"\n'
        'budget = 20000\nbudget_unit = "tokens"\n'
    )
    verdict = _run(
        _submit(0.0, "spender", _ok(duration=10.0, spend=spend)),
        _submit(20.0, "next", _ok(duration=10.0, spend=spend)),
        config=config,
    )
    starts = {e["run_id"]: e["t"] for e in _events(verdict) if e["event"] == "start"}
    assert starts["next"] == pytest.approx(10.0 + 300.0)  # the spender's end leaves the window


def test_a_backoff_due_while_draining_does_not_spin_the_dispatcher() -> None:
    # Found by sim fuzz (seed 55): draining, nothing starts, so a backoff
    # that ended stayed due and the dispatcher woke at once, for ever.
    config = CONFIG.replace("[supervisor]\n", '[supervisor]\nshutdown_grace = "10m"\n')
    verdict = _run(
        _submit(0.0, "long", _ok(duration=200.0)),
        _submit(0.0, "fails", _failed("overloaded", duration=50.0), _ok()),
        {"t": 10.0, "kind": "shutdown", "force_after": None},
        config=config,
    )
    events = _events(verdict)
    assert [e["run_id"] for e in events if e["event"] == "retry"] == ["fails"]


@pytest.mark.parametrize(
    ("attempt", "message"),
    [
        ({"failure": "meteor"}, "attempts[0].failure: expected one of overloaded,"),
        ({"failure": "idle_timeout"}, "attempts[0].failure idle_timeout ends a run timed_out"),
        ({"worked": "yes"}, "attempts[0].worked: expected true or false"),
        ({"spend": {"tokens": {"input": -1}}}, "attempts[0].spend.tokens.input: expected a whole"),
        ({"warning": {"resets_in": "soon"}}, 'attempts[0].warning: expected {"resets_in"'),
    ],
)
def test_a_malformed_attempt_names_its_field(attempt: dict[str, Any], message: str) -> None:
    data = draw_scenario(3).as_json()
    submit = _submit(0.0, "r1", {"duration": 1.0, "outcome": "failed", **attempt})
    data["events"] = [submit]
    with pytest.raises(ScenarioError) as caught:
        scenario_from_json(data, "case.jsonl")
    assert str(caught.value).startswith(f"case.jsonl: fuzz.events[0].{message}")


def _checks(config: Mapping[str, Any]) -> tuple[AccountChecks, list[str]]:
    failed: list[str] = []
    checks = AccountChecks(lambda kind, message: failed.append(kind))
    checks.configure(config, restart=True)
    return checks, failed


_RETRY = {"attempts": 3, "on": ["overloaded"], "after_work": []}


def _config(unit: str, budget: float) -> dict[str, Any]:
    account = {"name": "a", "window": "100s", "budget": budget, "budget_unit": unit}
    return {"providers": {"claude": {"accounts": [account], "retry": _RETRY}}}


def test_a_running_run_counts_at_the_mean_of_those_that_ended() -> None:
    checks, failed = _checks(_config("tokens", 300))
    checks.started("r1", "claude", "a", 0.0)
    checks.agent_ended("r1", AgentEnd(None, tokens=100))
    checks.finished("r1", {"outcome": "succeeded", "exit_code": 0}, 10.0)
    checks.started("r2", "claude", "a", 20.0)  # 100 spent, none running
    checks.started("r3", "claude", "a", 30.0)  # and r2 at the mean: 200
    assert failed == []
    checks.started("r4", "claude", "a", 40.0)  # 100 + 2 x 100 = 300: the budget
    assert failed == ["budget"]


def test_after_a_restart_every_attempt_of_a_run_still_counts() -> None:
    checks, failed = _checks(_config("runs", 2))
    checks.started("r1", "claude", "a", 0.0)
    checks.agent_ended("r1", AgentEnd("overloaded"))
    checks.retried("r1", "claude", {"attempt": 1, "failure": "overloaded"})
    checks.finished("r1", {"outcome": "failed", "exit_code": 1, "requeued": True}, 1.0)
    checks.started("r1", "claude", "a", 11.0)
    checks.agent_ended("r1", AgentEnd(None))
    checks.finished("r1", {"outcome": "succeeded", "exit_code": 0}, 12.0)
    # Two starts in the window, and the ledger a restart reads keeps both
    # attempts of the retried run: a third start breaks the budget.
    checks.crashed(set())
    assert failed == []
    checks.started("r2", "claude", "a", 13.0)
    assert failed == ["budget"]
    # The same when a reload gives the account back.
    checks.configure({"providers": {"claude": {"accounts": [], "retry": _RETRY}}}, restart=False)
    checks.configure(_config("runs", 3), restart=False)
    checks.started("r3", "claude", "a", 14.0)
    assert failed == ["budget", "budget"]
