"""Traces of retries, warnings, refused logins and spent budgets, recorded and replayed.

Each test records a trace with the real supervisor (real processes printing
the recorded Claude Code streams of tests/fixtures/agent_streams, a real
SQLite ledger, real git worktrees), then replays it under its own
configuration with both engines: every decision (starts and their
accounts, finishes, retries, near-limit marks, refused logins) is the
recorded one, as ``sim diff`` compares them. The stand-in agents are the
ones the retry and budget tests run (``retry_agent.py``, ``spend_agent.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import trio
from supervisor_support import Running, Start, config_at, git_repository, write_config
from test_account_budgets import SUCCESS_TOKENS, agent_config, finished, replay
from test_replay_shutdowns import replays_the_same
from test_retries import AGENT as RETRY_AGENT
from test_retries import submit

from herdsman.sim.decisions import Decision, read_decisions

ENGINES = ("trio", "fast")


async def recorded(running: Running, tmp_path: Path) -> Path:
    """Stop ``running``; its one trace file."""
    running.supervisor.request_shutdown()
    with trio.fail_after(30):
        await running.stopped.wait()
    [trace] = (tmp_path / "state" / "traces").glob("*.jsonl")
    return trace


def decisions(trace: Path, kind: str) -> list[Decision]:
    return [d for d in read_decisions(trace).decisions if d.kind == kind]


def finishes(trace: Path) -> dict[str, list[dict[str, Any]]]:
    """Each run's finish events' fields, in order."""
    found: dict[str, list[dict[str, Any]]] = {}
    for line in trace.read_text().splitlines()[1:]:
        event = json.loads(line)
        if event["event"] == "finish":
            found.setdefault(event["run_id"], []).append(event)
    return found


async def test_retried_exhausted_worked_and_crashed_runs_replay_with_their_retries(
    start: Start, tmp_path: Path
) -> None:
    repo = git_repository(tmp_path / "repo")
    retry = (
        'attempts = 3\non = ["overloaded", "rate_limit", "crash"]\n'
        'backoff = "1s"\nbackoff_max = "2s"'
    )
    block = (
        "[providers.agent]\n"
        f'exec = ["{sys.executable}", "{RETRY_AGENT}", "{tmp_path / "records.jsonl"}"]\n'
        'protocol = "claude"\nconcurrency = 2\n'
        f"[providers.agent.retry]\n{retry}\n"
        f'[[repos]]\nname = "repo"\npath = "{repo}"\n'
    )
    running = await start(config_at(write_config(tmp_path, extra="\n" + block)))
    endings = {
        "retried": "overloaded,success",
        "exhausted": "rate_limited",
        "worked": "tool_then_overloaded,success",
        "crashed": "crash,success",
    }
    ids = {
        name: await submit(running, ending, conversation=name) for name, ending in endings.items()
    }
    done = {name: await running.wait(run_id, 60) for name, run_id in ids.items()}
    assert [(done[n]["status"], done[n]["attempts"]) for n in endings] == [
        ("succeeded", 2),
        ("failed", 3),
        ("failed", 1),
        ("succeeded", 2),
    ]
    trace = await recorded(running, tmp_path)

    # The trace says what a replay needs: each failure's class, and that the
    # tool-calling attempt worked (overloaded retries, but not after work).
    ended = finishes(trace)
    assert ended[ids["worked"]] == [
        {**ended[ids["worked"]][0], "outcome": "failed", "failure": "overloaded", "worked": True}
    ]
    assert [f.get("failure") for f in ended[ids["exhausted"]]] == ["rate_limit"] * 3
    assert [f.get("failure") for f in ended[ids["crashed"]]] == ["crash", None]
    retries = [(d.run_id, dict(d.what)["failure"]) for d in decisions(trace, "retry")]
    assert sorted(retries) == sorted(
        [
            (ids["retried"], "overloaded"),
            (ids["exhausted"], "rate_limit"),
            (ids["exhausted"], "rate_limit"),
            (ids["crashed"], "crash"),
        ]
    )
    await replays_the_same(trace, tmp_path, ENGINES)


async def test_a_refused_login_moves_the_run_and_a_warned_account_gets_new_conversations_last(
    start: Start, tmp_path: Path
) -> None:
    config = agent_config(
        tmp_path, [("login", ""), ("near", 'window = "5h"'), ("spare", 'window = "5h"')]
    )
    running = await start(config)
    replay(tmp_path, "login", "claude-not-logged-in")
    replay(tmp_path, "near", "claude-usage-warning")
    # login (listed first) refuses it: the run moves to near, which warns.
    moved = await finished(running, conversation="c1")
    assert (moved["status"], moved["account"], moved["attempts"]) == ("succeeded", "near", 2)
    # Both others idle: near, warned, gets the new conversation last.
    fresh = await finished(running, conversation="c2")
    assert (fresh["status"], fresh["account"]) == ("succeeded", "spare")
    # A conversation already on near keeps it.
    again = await finished(running, conversation="c1")
    assert again["account"] == "near"
    trace = await recorded(running, tmp_path)

    [login] = decisions(trace, "needs_login")
    assert (login.run_id, dict(login.what)["account"]) == (moved["id"], "login")
    # Each run on near warns (its stream says so every time).
    warned = [(d.run_id, dict(d.what)["account"]) for d in decisions(trace, "near_limit")]
    assert warned == [(moved["id"], "near"), (again["id"], "near")]
    assert [dict(d.what)["account"] for d in decisions(trace, "start")] == [
        "login",
        "near",
        "spare",
        "near",
    ]
    await replays_the_same(trace, tmp_path, ENGINES)


async def test_a_token_and_a_dollar_budget_stop_their_accounts_in_the_replay_too(
    start: Start, tmp_path: Path
) -> None:
    tokens = f'window = "5h"\nbudget = {SUCCESS_TOKENS}\nbudget_unit = "tokens"'
    config = agent_config(tmp_path, [("tok", tokens), ("spare", "")])
    text = config.read_text()
    # A second provider on the same agent, its first account on a dollar budget.
    usd_block = text[text.index("[providers.agent]") :].replace("providers.agent", "providers.usd")
    usd_block = usd_block.replace(tokens, 'window = "5h"\nbudget = 0.02\nbudget_unit = "usd"')
    usd_block = usd_block.replace('name = "tok"', 'name = "dollars"')
    config.write_text(text + "\n" + usd_block)
    running = await start(config_at(config))
    placed = []
    for provider in ("agent", "usd"):
        for _ in range(2):
            run = await running.wait((await submit_to(running, provider))["id"], 60)
            placed.append((run["status"], run["account"]))
    # One run spends each budget: the second run of each provider goes on.
    assert placed == [
        ("succeeded", "tok"),
        ("succeeded", "spare"),
        ("succeeded", "dollars"),
        ("succeeded", "spare"),
    ]
    trace = await recorded(running, tmp_path)
    assert all("spend" in f for fs in finishes(trace).values() for f in fs)
    await replays_the_same(trace, tmp_path, ENGINES)


async def submit_to(running: Running, provider: str) -> dict[str, Any]:
    body = {"provider": provider, "prompt": "work"}
    response = await running.client.post("/v1/runs", json=body)
    assert response.status_code in (200, 201), response.text
    run: dict[str, Any] = response.json()
    return run
