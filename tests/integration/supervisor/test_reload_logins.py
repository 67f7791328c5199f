"""A reload logs the accounts in again only when it is applied, and its trace replays it.

A real supervisor on a real SQLite ledger runs ``spend_agent.py`` (see
test_account_budgets.py): account ``a``'s CLI is not logged in, so each run
it takes moves to ``b`` and marks ``a`` as needing a login. A rejected
reload (a bad edit) changes nothing, so ``a`` still needs one; an applied
reload, even of a file that did not change, frees it. Each freeing is traced,
so both replay engines free ``a`` at the same point and place every later run
as the recording did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from supervisor_support import Running, Start
from test_account_budgets import agent_config, finished, replay
from test_accounts import accounts
from test_replay_faults import ENGINES, recorded
from test_replay_shutdowns import replays_the_same


async def reloaded(running: Running) -> dict[str, Any]:
    """``POST /v1/reload``: its answer."""
    answer: dict[str, Any] = (await running.client.post("/v1/reload")).json()
    return answer


async def moved_off_a(running: Running, conversation: str) -> None:
    """A run ``a`` (listed first, free) takes, refuses, and hands to ``b``."""
    moved = await finished(running, conversation=conversation)
    assert (moved["status"], moved["account"], moved["attempts"]) == ("succeeded", "b", 2)
    assert (await accounts(running))["a"]["needs_login"] is not None


async def test_a_rejected_reload_keeps_the_login_needed_and_an_applied_one_frees_it_replayably(
    start: Start, tmp_path: Path
) -> None:
    path = agent_config(tmp_path, [("a", ""), ("b", "")])
    good = path.read_text()
    running = await start(path)
    replay(tmp_path, "a", "claude-not-logged-in")
    await moved_off_a(running, "c1")

    # A bad edit is rejected: nothing changed, so a still needs its login.
    path.write_text(good + "\n[providers.agent\n")
    assert not (await reloaded(running))["ok"]
    assert (await accounts(running))["a"]["needs_login"] is not None
    assert (await finished(running, conversation="c2"))["account"] == "b"

    # The edit undone: the file is the running configuration again, and the
    # applied reload (no changes) frees a, which refuses c3 again.
    path.write_text(good)
    answer = await reloaded(running)
    assert (answer["ok"], answer["changes"]) == (True, [])
    assert (await accounts(running))["a"]["needs_login"] is None
    await moved_off_a(running, "c3")

    # Logged in now; the same file reloaded once more (a repeat) frees a.
    replay(tmp_path, "a", None)
    answer = await reloaded(running)
    assert (answer["ok"], answer["repeat"]) == (True, True)
    assert (await accounts(running))["a"]["needs_login"] is None
    assert (await finished(running, conversation="c4"))["account"] == "a"
    trace = await recorded(running, tmp_path)

    events = [json.loads(line) for line in trace.read_text().splitlines()[1:]]
    reloads = [e for e in events if e["event"].startswith("reload")]
    # Each applied reload freed a, and says so with the generation it kept.
    assert [(e["event"], e.get("generation")) for e in reloads] == [
        ("reload_rejected", None),
        ("reload", 1),
        ("reload", 1),
    ]
    await replays_the_same(trace, tmp_path, ENGINES)
