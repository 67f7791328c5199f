"""Budgets in tokens and dollars, and accounts near their limit or needing a login, end to end.

A real supervisor on a real SQLite ledger runs ``spend_agent.py``, which
replays the recorded Claude Code streams of tests/fixtures/agent_streams by
account: a success that spent 3,338 budgeted tokens (1,234 input, 2,048
cache writes, 56 output; its 4,096 cache reads are not counted) and
$0.022418, a rate-limit warning, a login refused again and again, and a CLI
that is not logged in.
"""

from __future__ import annotations

import json
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from supervisor_support import Running, Start, write_config
from test_accounts import accounts, herdsman_in

AGENT = Path(__file__).with_name("spend_agent.py")
#: What one replayed success counts toward each budget unit.
SUCCESS_TOKENS = 1234 + 2048 + 56
SUCCESS_USD = 0.022418


def agent_config(tmp_path: Path, accounts: list[tuple[str, str]]) -> Path:
    """A supervisor.toml whose ``agent`` provider (Claude Code's protocol) runs spend_agent.py."""
    records = tmp_path / "records.jsonl"
    lines = [
        "[providers.agent]",
        f'exec = ["{sys.executable}", "{AGENT}", "{records}"]',
        'protocol = "claude"',
        "concurrency = 1",
        'idle_timeout = "1h"',
    ]
    for name, settings in accounts:
        home = tmp_path / "homes" / name
        home.mkdir(parents=True, exist_ok=True)
        lines += [
            "[[providers.agent.accounts]]",
            f'name = "{name}"',
            f'env = {{ CLAUDE_CONFIG_DIR = "{home}" }}',
            settings,
        ]
    return write_config(tmp_path, extra="\n" + "\n".join(lines) + "\n")


def replay(tmp_path: Path, account: str, case: str | None) -> None:
    """Make ``account``'s runs replay ``case`` (None: the recorded success)."""
    chosen = tmp_path / "homes" / account / "stream"
    if case is None:
        chosen.unlink(missing_ok=True)
    else:
        chosen.write_text(case)


async def submit(running: Running, **fields: Any) -> dict[str, Any]:
    response = await running.client.post(
        "/v1/runs", json={"provider": "agent", "prompt": "work", **fields}
    )
    assert response.status_code in (200, 201), response.text
    run: dict[str, Any] = response.json()
    return run


async def finished(running: Running, **fields: Any) -> dict[str, Any]:
    return await running.wait((await submit(running, **fields))["id"])


async def cli(tmp_path: Path, *args: str) -> str:
    shown = await trio.to_thread.run_sync(partial(herdsman_in, tmp_path, *args))
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def account_rows(table: str) -> dict[str, str]:
    return {line.split()[1]: line for line in table.splitlines()[1:] if line.strip()}


#: Each unit: the budget written, what one replayed success uses of it, how ``accounts`` shows it.
BUDGETS = {
    "tokens": (str(SUCCESS_TOKENS), SUCCESS_TOKENS, "3.3k tokens of 3.3k"),
    "usd": ("0.02", SUCCESS_USD, "$0.02 of $0.02"),
}


@pytest.mark.parametrize("unit", sorted(BUDGETS))
async def test_a_budget_in_tokens_or_dollars_moves_runs_on_and_survives_a_restart(
    start: Start, tmp_path: Path, unit: str
) -> None:
    budget, used, shown = BUDGETS[unit]
    budgeted = f'window = "5h"\nbudget = {budget}\nbudget_unit = "{unit}"'
    running = await start(agent_config(tmp_path, [("a", budgeted), ("b", "")]))
    first = await finished(running)
    assert (first["status"], first["account"]) == ("succeeded", "a")
    # One run spent a's budget: the next goes to b.
    second = await finished(running)
    assert (second["status"], second["account"]) == ("succeeded", "b")
    a = (await accounts(running))["a"]
    assert (a["unit"], a["available"]) == (unit, False)
    assert a["usage"] == pytest.approx(used, abs=1e-3)
    assert a["reason"].startswith("budget of ")
    assert a["reason"].endswith(" per window spent")
    assert shown in account_rows(await cli(tmp_path, "accounts"))["a"]

    running.supervisor.request_shutdown()
    with trio.fail_after(20):
        await running.stopped.wait()
    again = await start(running.config)
    restored = (await accounts(again))["a"]
    # The window comes back from the ledger: a is still spent.
    assert restored["usage"] == pytest.approx(used, abs=1e-3)
    assert not restored["available"]
    third = await again.wait((await submit(again))["id"])
    assert third["account"] == "b"


async def restarted(running: Running, start: Start) -> Running:
    running.supervisor.request_shutdown()
    with trio.fail_after(20):
        await running.stopped.wait()
    return await start(running.config)


@pytest.mark.parametrize(
    ("case", "others", "attempts"),
    # Retried twice on its account; moved off it by a refused login.
    [("claude-standin-overloaded", [], 3), ("claude-not-logged-in", [("b", "")], 2)],
)
async def test_a_restart_restores_every_attempt_an_account_was_charged(
    start: Start, tmp_path: Path, case: str, others: list[tuple[str, str]], attempts: int
) -> None:
    budgeted = 'window = "5h"\nbudget = 10\nbudget_unit = "runs"'
    retry = '\n[providers.agent.retry]\nbackoff = "1s"\nbackoff_max = "1s"'
    running = await start(agent_config(tmp_path, [("a", budgeted + retry), *others]))
    replay(tmp_path, "a", case)
    run = await finished(running)
    assert run["attempts"] == attempts
    charged = [
        json.loads(line)["home"] for line in (tmp_path / "records.jsonl").read_text().splitlines()
    ]
    live = (await accounts(running))["a"]["usage"]
    assert live == charged.count(str(tmp_path / "homes" / "a"))
    # The book read back from the ledger counts what the running one counted.
    again = await restarted(running, start)
    assert (await accounts(again))["a"]["usage"] == live


async def test_a_warned_account_gets_new_conversations_last_but_keeps_its_own(
    start: Start, tmp_path: Path
) -> None:
    running = await start(agent_config(tmp_path, [("a", 'window = "5h"'), ("b", "")]))
    replay(tmp_path, "a", "claude-usage-warning")
    before = time.time()
    warned = await finished(running, conversation="c1")
    assert (warned["status"], warned["account"]) == ("succeeded", "a")
    a = (await accounts(running))["a"]
    # The warning's reset is long past in the recording: the account's window stands in.
    assert a["near_limit_until"] is not None
    assert before + 5 * 3600 <= a["near_limit_until"] <= time.time() + 5 * 3600
    assert a["available"]
    assert a["needs_login"] is None
    replay(tmp_path, "a", None)

    # Both accounts are idle and unused: without the warning, a (listed first) would take it.
    fresh = await finished(running, conversation="c2")
    assert fresh["account"] == "b"
    # c1's session lives on a: it keeps a, warned or not.
    kept = await finished(running, conversation="c1")
    assert kept["account"] == "a"

    assert "available, near its limit until" in account_rows(await cli(tmp_path, "accounts"))["a"]
    assert "agent/a is near its limit until" in await cli(tmp_path, "status")


@pytest.mark.parametrize("case", ["claude-standin-unauthorized", "claude-not-logged-in"])
async def test_a_run_that_cannot_log_in_marks_its_account_and_moves_to_another(
    start: Start, tmp_path: Path, case: str
) -> None:
    path = agent_config(tmp_path, [("a", ""), ("b", "")])
    running = await start(path)
    replay(tmp_path, "a", case)
    moved = await finished(running, conversation="c1")
    assert (moved["status"], moved["account"], moved["attempts"]) == ("succeeded", "b", 2)
    assert any("not logged in" in note for note in moved["notes"]), moved["notes"]
    written = (tmp_path / "records.jsonl").read_text().splitlines()
    cases = [json.loads(line)["case"] for line in written]
    assert cases == [case, "claude-standin-success"]
    a = (await accounts(running))["a"]
    assert not a["available"]
    assert a["needs_login"] is not None
    assert a["reason"] == f"needs login ({a['needs_login']})"
    if case == "claude-standin-unauthorized":
        # Stopped at the third refused retry, not left to retry until its idle timeout.
        assert "stopped early" in a["needs_login"]
        assert "authentication_failed" in a["needs_login"]
    assert "needs login" in account_rows(await cli(tmp_path, "accounts"))["a"]
    assert "agent/a needs a login" in await cli(tmp_path, "status")

    # Taken by no run, whatever it is asked, until an end of its rest...
    assert (await finished(running, conversation="c2"))["account"] == "b"
    ended = await running.client.post(
        "/v1/accounts/end-rest", json={"provider": "agent", "account": "a"}
    )
    assert ended.status_code == 200, ended.text
    assert ended.json()["needs_login"] is None
    assert (await accounts(running))["a"]["available"]

    # ...or a reload, even of a file that did not change.
    assert (await finished(running, conversation="c3"))["account"] == "b"  # a failed again
    assert (await accounts(running))["a"]["needs_login"] is not None
    replay(tmp_path, "a", None)
    assert (await running.client.post("/v1/reload")).json()["ok"]
    assert (await accounts(running))["a"]["needs_login"] is None
    assert (await finished(running, conversation="c4"))["account"] == "a"
