"""Accounts end to end: a real supervisor, real processes, the CLIs' real limit output.

``limit_agent.py`` prints each CLI's usage-limit output when its account's
home holds a ``limited`` marker, and records which account environment
reached it, so these tests see both sides: what herdsman decided and what the
agent got.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import trio
from supervisor_support import Running, Start, config_at, write_config

from herdsman.trace import read_trace

AGENT = Path(__file__).with_name("limit_agent.py")
HOME_VARIABLE = {"claude": "CLAUDE_CONFIG_DIR", "codex": "CODEX_HOME", "plain": "AGENT_HOME"}


def provider_block(
    tmp_path: Path,
    shape: str,
    accounts: list[tuple[str, str]],
    extra: str = "",
    concurrency: int = 2,
) -> str:
    """``[providers.agent]`` running limit_agent.py with ``accounts`` as (name, extra TOML)."""
    family = shape.split("-", 1)[0]
    records = tmp_path / "records.jsonl"
    lines = [
        "[providers.agent]",
        f'exec = ["{sys.executable}", "{AGENT}", "{shape}", "{records}"]',
        f'protocol = "{family}"',
        f"concurrency = {concurrency}",
        'resume_args = ["--resume", "{session}"]',
    ]
    if family == "plain":
        lines.append(r"usage_limit_pattern = 'LIMIT resets_at=(?P<resets_at>\d+)'")
    lines.append(extra)
    for name, settings in accounts:
        home = tmp_path / "homes" / name
        home.mkdir(parents=True, exist_ok=True)
        lines += [
            "[[providers.agent.accounts]]",
            f'name = "{name}"',
            f'env = {{ {HOME_VARIABLE[family]} = "{home}" }}',
            settings,
        ]
    return "\n".join(lines) + "\n"


def limit(tmp_path: Path, account: str, resets_in: float, until: float | None = None) -> None:
    """Make ``account``'s runs hit the usage limit (until ``until``, if given)."""
    marker = tmp_path / "homes" / account / "limited"
    marker.write_text(json.dumps({"resets_in": resets_in, "until": until}))


def records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "records.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


async def serve_agent(
    start: Start, tmp_path: Path, shape: str, accounts: list[tuple[str, str]], **options: Any
) -> Running:
    block = provider_block(tmp_path, shape, accounts, **options)
    return await start(config_at(write_config(tmp_path, extra="\n" + block)))


async def submit(running: Running, **fields: Any) -> dict[str, Any]:
    body = {"provider": "agent", "prompt": "work", **fields}
    response = await running.client.post("/v1/runs", json=body)
    assert response.status_code in (200, 201), response.text
    run: dict[str, Any] = response.json()
    return run


async def accounts(running: Running) -> dict[str | None, dict[str, Any]]:
    response = await running.client.get("/v1/accounts")
    assert response.status_code == 200, response.text
    return {a["account"]: a for a in response.json()["accounts"]}


def herdsman_in(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, run on ``cwd``'s supervisor.toml."""
    return subprocess.run(
        [sys.executable, "-m", "herdsman", *args, "-c", "supervisor.toml"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def next_8pm_berlin(now: float) -> float:
    zone = ZoneInfo("Europe/Berlin")
    today = datetime.fromtimestamp(now, zone).replace(hour=20, minute=0, second=0, microsecond=0)
    if today.timestamp() <= now:
        today += timedelta(days=1)
    return today.replace(hour=20).timestamp()


# Each shape: how far ahead the agent says the limit resets, and the reset
# herdsman must read from it (a function of the time the run happened).
SHAPES: dict[str, Callable[[float], float]] = {
    "claude-event": lambda now: now + 3600,
    "claude-text": next_8pm_berlin,
    "claude-epoch": lambda now: now + 3600,
    "codex-relative": lambda now: now + 5 * 86400 + 22 * 3600 + 11 * 60,
    "codex-field": lambda now: now + 3600,
    "plain": lambda now: now + 3600,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_a_usage_limit_rests_the_account_and_the_run_moves_to_another(
    start: Start, tmp_path: Path, shape: str
) -> None:
    running = await serve_agent(start, tmp_path, shape, [("a", ""), ("b", "")])
    limit(tmp_path, "a", resets_in=3600)
    before = time.time()
    run = await running.wait((await submit(running, conversation="c1"))["id"])
    after = time.time()

    assert run["status"] == "succeeded", run
    assert (run["account"], run["attempts"]) == ("b", 2)
    first, second = records(tmp_path)
    # Each attempt got its own account's environment, and knew its name.
    assert (first["account"], Path(first["home"]).name, first["limited"]) == ("a", "a", True)
    assert (second["account"], Path(second["home"]).name, second["limited"]) == ("b", "b", False)
    assert second["args"] == []  # a fresh session: nothing to resume on b
    notes = " | ".join(run["notes"])
    assert "usage limit of account a" in notes, notes
    assert "re-queued" in notes, notes
    if shape == "plain":
        # A plain CLI reports no session: nothing stays behind on a, so the
        # conversation does not "move".
        assert "moved" not in notes, notes
    else:
        assert "moved from account a to account b" in notes, notes

    rested = (await accounts(running))["a"]
    assert not rested["available"]
    expected = (SHAPES[shape](before), SHAPES[shape](after))
    assert expected[0] - 2 <= rested["exhausted_until"] <= expected[1] + 2, (rested, expected)
    assert rested["reason"] == "usage limit reached"

    # The trace says so, for the simulator: which account, until when, and
    # that the run went back to the queue rather than ended.
    _, events = read_trace(next((tmp_path / "state" / "traces").glob("*.jsonl")))
    kinds = [(e.event, e.fields.get("account"), e.fields.get("outcome")) for e in events]
    assert ("usage_limit", "a", None) in kinds
    assert kinds.count(("start", "a", None)) == 1
    assert kinds.count(("start", "b", None)) == 1


async def test_a_conversation_stays_on_its_account_and_resumes_only_there(
    start: Start, tmp_path: Path
) -> None:
    running = await serve_agent(start, tmp_path, "claude-event", [("a", ""), ("b", "")])
    one = await running.wait((await submit(running, conversation="c1"))["id"])
    # Another conversation makes "b" the less used account; c1 still stays on "a".
    await running.wait((await submit(running, conversation="c2"))["id"])
    two = await running.wait((await submit(running, conversation="c1"))["id"])
    assert (one["account"], two["account"]) == ("a", "a")
    assert records(tmp_path)[2]["args"] == ["--resume", one["session_id"]]

    limit(tmp_path, "a", resets_in=3600)
    three = await running.wait((await submit(running, conversation="c1"))["id"])
    assert (three["status"], three["account"]) == ("succeeded", "b")
    limited_try, moved_try = records(tmp_path)[3:]
    assert limited_try["args"] == ["--resume", two["session_id"]]  # still on a: resumed
    assert moved_try["args"] == []  # on b: the session stayed behind on a


async def test_runs_wait_while_every_account_rests_and_resume_after_the_reset(
    start: Start, tmp_path: Path
) -> None:
    running = await serve_agent(start, tmp_path, "codex-field", [("a", "")])
    # The agent reports a reset (whole seconds) after its limit truly ends.
    limit(tmp_path, "a", resets_in=3, until=time.time() + 1)
    first = await submit(running, conversation="c1")
    with trio.fail_after(10):
        while not (await accounts(running))["a"]["exhausted_until"]:
            await trio.sleep(0.05)
    second = await submit(running, conversation="c2")
    status = (await running.client.get("/v1/status")).json()
    waiting = status["waiting_for_accounts"]["agent"]
    assert "a: usage limit reached" in waiting["reason"]
    assert waiting["until"] > time.time()
    assert (await running.client.get(f"/v1/runs/{second['id']}")).json()["status"] == "queued"

    done = [await running.wait(run["id"], 30) for run in (first, second)]
    assert [(r["status"], r["account"]) for r in done] == [("succeeded", "a")] * 2
    assert done[0]["attempts"] == 2
    # Nothing ran on the account before it came back.
    resets = [r for r in records(tmp_path) if not r["limited"]]
    assert len(resets) == 2


async def test_a_second_usage_limit_ends_the_run_as_usage_limited(
    start: Start, tmp_path: Path
) -> None:
    running = await serve_agent(start, tmp_path, "codex-field", [("a", "")])
    limit(tmp_path, "a", resets_in=1)  # always limited; each time for one second
    run = await running.wait((await submit(running))["id"], 30)
    assert (run["status"], run["attempts"]) == ("usage_limited", 2)
    assert len(records(tmp_path)) == 2


async def test_a_provider_without_accounts_waits_out_its_limit_in_the_ambient_environment(
    start: Start, tmp_path: Path
) -> None:
    home = tmp_path / "homes" / "ambient"
    home.mkdir(parents=True)
    block = provider_block(tmp_path, "plain", [], extra=f'env = {{ AGENT_HOME = "{home}" }}')
    running = await start(config_at(write_config(tmp_path, extra="\n" + block)))
    limit(tmp_path, "ambient", resets_in=2, until=time.time() + 1)
    run = await running.wait((await submit(running))["id"], 30)
    assert (run["status"], run["account"], run["attempts"]) == ("succeeded", None, 2)
    assert [r["account"] for r in records(tmp_path)] == [None, None]


async def test_per_account_caps_hold_below_the_provider_cap(start: Start, tmp_path: Path) -> None:
    running = await serve_agent(
        start,
        tmp_path,
        "plain",
        [("a", "concurrency = 1"), ("b", "concurrency = 1")],
        concurrency=4,
    )
    runs = [await submit(running) for _ in range(6)]
    for run in runs:
        assert (await running.wait(run["id"]))["status"] == "succeeded"
    _, events = read_trace(next((tmp_path / "state" / "traces").glob("*.jsonl")))
    in_use: dict[str, int] = {"a": 0, "b": 0}
    holder: dict[str, str] = {}
    for event in events:
        if event.event == "start":
            holder[event.fields["run_id"]] = event.fields["account"]
            in_use[event.fields["account"]] += 1
            assert max(in_use.values()) <= 1, in_use
        elif event.event == "finish":
            in_use[holder[event.fields["run_id"]]] -= 1
    assert set(holder.values()) == {"a", "b"}


async def test_exhaustion_and_window_usage_survive_a_restart(start: Start, tmp_path: Path) -> None:
    accounts_toml = [("a", ""), ("b", 'window = "1h"\nbudget = 5')]
    running = await serve_agent(start, tmp_path, "claude-epoch", accounts_toml)
    limit(tmp_path, "a", resets_in=3600)
    run = await running.wait((await submit(running))["id"])
    assert (run["status"], run["account"]) == ("succeeded", "b")
    until = (await accounts(running))["a"]["exhausted_until"]
    running.supervisor.request_shutdown()
    with trio.fail_after(20):
        await running.stopped.wait()

    again = await start(running.config)
    after = await accounts(again)
    assert after["a"]["exhausted_until"] == until
    assert not after["a"]["available"]
    assert after["b"]["usage"] == 1.0  # the run before the restart counts in b's window


async def test_the_accounts_command_and_status_say_who_rests_until_when(
    start: Start, tmp_path: Path
) -> None:
    running = await serve_agent(
        start, tmp_path, "claude-epoch", [("a", ""), ("b", 'window = "1h"\nbudget = 5')]
    )
    limit(tmp_path, "a", resets_in=3600)
    limit(tmp_path, "b", resets_in=7200)
    ended = await running.wait((await submit(running))["id"])
    assert (ended["status"], ended["attempts"]) == ("usage_limited", 2)
    waiting = await submit(running)

    cli = partial(herdsman_in, tmp_path)
    shown = await trio.to_thread.run_sync(cli, "accounts")
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[1]: line for line in shown.stdout.splitlines()[1:]}
    assert "usage limit until" in rows["a"]
    assert "1/5 runs" in rows["b"]
    assert "usage limit until" in rows["b"]
    status = await trio.to_thread.run_sync(cli, "status")
    assert status.returncode == 0, status.stderr
    assert (
        "agent waits for an account: a: usage limit reached; b: usage limit reached"
        in status.stdout
    )
    as_json = json.loads((await trio.to_thread.run_sync(cli, "accounts", "--json")).stdout)
    # The wait ends when the first rest does: a's reset, exactly as the agent
    # printed it (b's, an hour later, is not it). Read from the agent's record,
    # not from this clock, which a loaded machine may have moved on by minutes.
    reported = {r["account"]: r["resets_at"] for r in records(tmp_path) if r["limited"]}
    assert reported["b"] > reported["a"]
    assert as_json["waiting"]["agent"]["until"] == reported["a"]
    record = (await running.client.get(f"/v1/runs/{waiting['id']}")).json()
    assert record["status"] == "queued"


async def test_an_account_removed_and_added_again_keeps_its_rest(
    start: Start, tmp_path: Path
) -> None:
    block = provider_block(tmp_path, "claude-epoch", [("a", ""), ("b", "")])
    path = write_config(tmp_path, extra="\n" + block)
    running = await start(path)
    limit(tmp_path, "a", resets_in=3600)
    run = await running.wait((await submit(running))["id"])
    assert run["account"] == "b"
    until = (await accounts(running))["a"]["exhausted_until"]
    assert until is not None

    with_a = path.read_text()
    a_table = with_a[with_a.index("[[providers.agent.accounts]]") : with_a.index('name = "b"')]
    a_table = a_table[: a_table.rindex("[[providers.agent.accounts]]")]
    path.write_text(with_a.replace(a_table, ""))
    assert (await running.client.post("/v1/reload")).json()["ok"]
    assert "a" not in await accounts(running)
    path.write_text(with_a)
    assert (await running.client.post("/v1/reload")).json()["ok"]
    back = (await accounts(running))["a"]
    assert (back["exhausted_until"], back["available"]) == (until, False)


async def test_a_rest_can_be_ended_by_hand_from_the_api_and_the_cli(
    start: Start, tmp_path: Path
) -> None:
    running = await serve_agent(start, tmp_path, "claude-epoch", [("a", ""), ("b", "")])
    limit(tmp_path, "a", resets_in=3600)
    limit(tmp_path, "b", resets_in=3600)
    ended = await running.wait((await submit(running))["id"])
    assert ended["status"] == "usage_limited"
    assert not (await accounts(running))["a"]["available"]

    (tmp_path / "homes" / "a" / "limited").unlink()
    waiting = await submit(running)
    answer = await running.client.post(
        "/v1/accounts/end-rest", json={"provider": "agent", "account": "a"}
    )
    assert answer.status_code == 200, answer.text
    assert (answer.json()["available"], answer.json()["exhausted_until"]) == (True, None)
    # The queued run starts at once on the account that is back.
    done = await running.wait(waiting["id"])
    assert (done["status"], done["account"]) == ("succeeded", "a")
    # Traced, so a replay ends the rest at the same moment.
    _, events = read_trace(next((tmp_path / "state" / "traces").glob("*.jsonl")))
    ended_rests = [e.fields for e in events if e.event == "rest_ended"]
    assert ended_rests == [{"provider": "agent", "account": "a"}]

    unknown = await running.client.post(
        "/v1/accounts/end-rest", json={"provider": "agent", "account": "zz"}
    )
    assert (unknown.status_code, unknown.json()["error"]) == (
        404,
        "provider 'agent' has no account 'zz'; its accounts: a, b",
    )
    # No ambient account: the provider's accounts are named, so name one.
    ambient = await running.client.post("/v1/accounts/end-rest", json={"provider": "agent"})
    assert (ambient.status_code, ambient.json()["error"]) == (
        404,
        "provider 'agent' has no ambient account; name one of its accounts (a, b),"
        " e.g. `accounts end-rest agent a`",
    )
    bad = await running.client.post("/v1/accounts/end-rest", json={"provider": 3})
    assert (bad.status_code, bad.json()["error"]) == (
        422,
        "provider: required, a string; got 3",
    )

    end_rest = partial(herdsman_in, tmp_path, "accounts", "end-rest")
    cli = await trio.to_thread.run_sync(end_rest, "agent", "b")
    assert (cli.returncode, cli.stdout) == (0, "agent/b: available\n"), cli.stderr
    nope = await trio.to_thread.run_sync(end_rest, "nope")
    assert (nope.returncode, nope.stdout) == (1, "")
    assert nope.stderr == (
        "herdsman: no provider 'nope' is configured (configured: demo, agent) (HTTP 404)\n"
    )
    assert (await accounts(running))["b"]["exhausted_until"] is None
    # Ended in the ledger too: a restart does not bring the rests back.
    now = time.time()
    assert await running.supervisor.ledger.call(lambda s: s.account_limits(now)) == []


async def test_an_account_added_back_keeps_its_window_usage_whatever_the_others_windows(
    start: Start, tmp_path: Path
) -> None:
    # While "a" is away no account has a quota window; when it comes back its
    # usage must be read over its own window, not over the others' (none).
    quota = ("a", 'window = "1h"\nbudget = 1')
    only_a = provider_block(tmp_path, "claude-epoch", [quota])
    only_b = provider_block(tmp_path, "claude-epoch", [("b", "")])
    both = provider_block(tmp_path, "claude-epoch", [quota, ("b", "")])
    path = write_config(tmp_path, extra="\n" + only_a)
    running = await start(path)
    done = await running.wait((await submit(running))["id"])
    assert (done["status"], done["account"]) == ("succeeded", "a")
    assert (await accounts(running))["a"]["usage"] == 1
    text = path.read_text()
    path.write_text(text.replace(only_a, only_b))
    assert (await running.client.post("/v1/reload")).json()["ok"]
    assert "a" not in await accounts(running)
    path.write_text(text.replace(only_a, both))
    assert (await running.client.post("/v1/reload")).json()["ok"]
    back = (await accounts(running))["a"]
    assert (back["usage"], back["available"]) == (1, False)
