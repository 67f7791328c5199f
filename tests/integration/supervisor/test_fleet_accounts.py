"""Accounts fleet-wide: two supervisors, one PostgreSQL ledger, one shared account.

Both members are served in the test (real processes for the agent, the
real HTTP API); ``limit_agent.py`` prints Claude Code's usage-limit output
while the account's home holds a ``limited`` marker. The ledger is read
directly to see what the fleet did as a whole.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import trio
from cli_support import CLI, herdsman
from supervisor_support import Running, Start, write_config
from test_account_budgets import agent_config, replay
from test_accounts import accounts, limit, provider_block, submit
from test_fleet_member import fleet_of, member_url, other

from herdsman.runtime.store import NewRun, RunEnd, RunStatus
from herdsman.runtime.store.fleet import FleetStore

__all__ = ["member_url", "other"]  # fixtures these tests use

POLL = 1.0


def member_config(tmp_path: Path, name: str, url: str, settings: str) -> Path:
    """A member's supervisor.toml, in a directory of its own, with account ``work``."""
    block = provider_block(tmp_path, "claude-event", [("work", settings)])
    fleet = f'[store]\nurl = "{url}"\n[fleet]\nenabled = true\nlease = "5s"\npoll = "{POLL:g}s"\n'
    directory = tmp_path / name
    directory.mkdir()
    return write_config(directory, extra=fleet + "\n" + block)


async def two_members(
    start: Start, tmp_path: Path, url: str, settings: str
) -> tuple[Running, Running]:
    """Members A and B, each with its own state, sharing account ``work`` (``settings``)."""
    a = await start(member_config(tmp_path, "a", url, settings))
    return a, await start(member_config(tmp_path, "b", url, settings))


def ledger_runs(postgres_url: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT id, status, started_at, attempts, held_by FROM runs").fetchall()
    return {
        row[0]: {"status": row[1], "started_at": row[2], "attempts": row[3], "held_by": row[4]}
        for row in rows
    }


async def stop(*members: Running) -> None:
    for member in members:
        member.supervisor.request_shutdown()
    for member in members:
        await member.stopped.wait()


async def test_the_fleet_starts_no_more_runs_in_a_window_than_the_budget(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str
) -> None:
    a, b = await two_members(start, tmp_path, member_url, 'window = "1h"\nbudget = 3')
    for n in range(4):
        await submit(a, id=f"a{n}")
        await submit(b, id=f"b{n}")
    with trio.fail_after(20):
        while sum(r["status"] == "succeeded" for r in ledger_runs(postgres_url).values()) < 3:
            await trio.sleep(0.1)
    await trio.sleep(3 * POLL)  # every member has polled since: still three
    runs = ledger_runs(postgres_url)
    started = sorted(i for i, r in runs.items() if r["started_at"] is not None)
    assert len(started) == 3, runs
    assert all(runs[i]["status"] == "succeeded" and runs[i]["attempts"] == 1 for i in started)
    assert sum(r["status"] == "queued" for r in runs.values()) == 5
    # Both members count the fleet's three, whichever ran them, and say why runs wait.
    for member in (a, b):
        work = (await accounts(member))["work"]
        assert (work["usage"], work["budget"]) == (3, 3), work
        assert work["reason"] == "budget of 3 runs per window spent", work
        status = (await member.client.get("/v1/status")).json()
        assert "agent" in status["waiting_for_accounts"], status
    await stop(a, b)


async def resting(member: Running) -> bool:
    work = (await accounts(member))["work"]
    return bool(work["reason"] == "usage limit reached")


async def test_a_rest_recorded_by_one_member_holds_on_the_other_until_ended_through_it(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str
) -> None:
    a, b = await two_members(start, tmp_path, member_url, "")
    limit(tmp_path, "work", resets_in=3600)
    await submit(a, id="hit")
    with trio.fail_after(20):
        while ledger_runs(postgres_url)["hit"]["attempts"] == 0:
            await trio.sleep(0.05)
        while not (await resting(a) or await resting(b)):
            await trio.sleep(0.05)
    # Whichever member ran it recorded the rest; the other follows within a poll.
    holder = ledger_runs(postgres_url)["hit"]["held_by"]
    recorder, follower = (a, b) if holder == fleet_of(a).store.member_id else (b, a)
    with trio.fail_after(POLL + 1):
        while not await resting(follower):
            await trio.sleep(0.05)
    # Neither starts anything on the account while it rests.
    await submit(follower, id="after")
    await trio.sleep(2 * POLL)
    runs = ledger_runs(postgres_url)
    assert (runs["hit"]["status"], runs["hit"]["attempts"]) == ("queued", 1), runs
    assert (runs["after"]["status"], runs["after"]["attempts"]) == ("queued", 0), runs
    # Ended through the member that did not record it: over on the recorder too.
    (tmp_path / "homes" / "work" / "limited").unlink()
    ended = await follower.client.post(
        "/v1/accounts/end-rest", json={"provider": "agent", "account": "work"}
    )
    assert ended.status_code == 200, ended.text
    with trio.fail_after(POLL + 1):
        while await resting(recorder):
            await trio.sleep(0.05)
    for run_id in ("hit", "after"):
        body = await recorder.wait(run_id)
        assert body["status"] == "succeeded", body
    await stop(a, b)


async def test_an_account_a_reload_brings_back_counts_each_run_of_the_fleet_once(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    other.submit(NewRun(id="there", provider="agent", prompt="p"), time.time())
    assert other.claim_many([("there", "work")], time.time()).claimed
    path = member_config(tmp_path, "a", member_url, 'window = "1h"\nbudget = 10')
    a = await start(path)
    other.finish("there", RunEnd(RunStatus.SUCCEEDED, exit_code=0), time.time())
    for n in range(2):
        assert (await a.wait((await submit(a, id=f"here{n}"))["id"]))["status"] == "succeeded"
    await trio.sleep(2 * POLL)
    assert (await accounts(a))["work"]["usage"] == 3
    # Removed (the provider runs in the ambient environment), then back:
    # its usage comes back from the ledger, this member's runs and the other's.
    with_work = path.read_text()
    path.write_text(with_work[: with_work.index("[[providers.agent.accounts]]")])
    assert (await a.client.post("/v1/reload")).json()["ok"]
    assert "work" not in await accounts(a)
    path.write_text(with_work)
    assert (await a.client.post("/v1/reload")).json()["ok"]
    await trio.sleep(2 * POLL)
    assert (await accounts(a))["work"]["usage"] == 3
    await stop(a)


async def test_the_accounts_api_and_command_show_the_fleets_usage(
    start: Start, tmp_path: Path, member_url: str, other: FleetStore
) -> None:
    path = member_config(tmp_path, "a", member_url, 'window = "1h"\nbudget = 10')
    a = await start(path)
    other.submit(NewRun(id="there", provider="agent", prompt="p"), time.time())
    assert other.claim_many([("there", "work")], time.time()).claimed  # runs on, elsewhere
    with trio.fail_after(POLL + 2):
        while (await accounts(a))["work"]["running_elsewhere"] != 1:
            await trio.sleep(0.05)
    work = (await accounts(a))["work"]
    assert (work["running"], work["usage"]) == (0, 1), work

    shown = await trio.to_thread.run_sync(partial(herdsman, "accounts", *CLI, cwd=path.parent))
    assert shown.returncode == 0, shown.stderr
    [row] = [line.split() for line in shown.stdout.splitlines()[1:] if " work " in line]
    assert row[2:5] == ["0+1", "1/10", "runs"], shown.stdout
    await stop(a)


async def usage_becomes(running: Running, account: str, usage: float) -> None:
    """Wait (a poll or two) until ``account``'s usage on ``running`` is ``usage``."""
    with trio.fail_after(4 * POLL + 5):
        while (await accounts(running))[account]["usage"] != usage:
            await trio.sleep(0.05)


async def test_a_member_restores_each_attempt_it_ran_after_a_reload_and_a_restart(
    start: Start, tmp_path: Path, member_url: str, postgres_url: str
) -> None:
    # A run moved off budgeted account a by a refused login, then run on b:
    # its first attempt is kept in run_attempts, held by the member that ran it.
    budgeted = 'window = "5h"\nbudget = 10\nbudget_unit = "runs"'
    path = agent_config(tmp_path, [("a", budgeted), ("b", "")])
    fleet = f'\n[store]\nurl = "{member_url}"\n[fleet]\nenabled = true\npoll = "{POLL:g}s"\n'
    with_a = path.read_text() + fleet
    path.write_text(with_a)
    replay(tmp_path, "a", "claude-not-logged-in")
    running = await start(path)
    run = await running.wait((await submit(running, id="moved"))["id"])
    assert (run["status"], run["account"], run["attempts"]) == ("succeeded", "b", 2)
    member = fleet_of(running).store.member_id
    with psycopg.connect(postgres_url) as conn:
        held = conn.execute("SELECT account, held_by FROM run_attempts").fetchall()
    assert held == [("a", member)]
    # Counted once as it ran (a start), and never again from the ledger's polls.
    await trio.sleep(2 * POLL)
    assert (await accounts(running))["a"]["usage"] == 1
    # Removed, then back: its own attempt comes back from the ledger.
    path.write_text(with_a.replace('name = "a"', 'name = "gone"'))
    assert (await running.client.post("/v1/reload")).json()["ok"]
    path.write_text(with_a)
    assert (await running.client.post("/v1/reload")).json()["ok"]
    assert (await accounts(running))["a"]["usage"] == 1
    await trio.sleep(2 * POLL)
    assert (await accounts(running))["a"]["usage"] == 1
    await stop(running)
    # Restarted, the supervisor is a new member: the attempt the earlier
    # process ran is another member's, counted from the poll, once.
    again = await start(path)
    await usage_becomes(again, "a", 1)
    await trio.sleep(2 * POLL)
    assert (await accounts(again))["a"]["usage"] == 1
    await stop(again)
