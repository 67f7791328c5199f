"""Cancelled attempts, recorded and replayed: their spend, session and exit code are the recorded.

The real supervisor (a real SQLite ledger, ``spend_agent.py`` printing the
recorded Claude Code success and then left running) cancels a run on
account ``tok`` by request once its stream has reported what it spent and
its session; what it spent uses up ``tok``'s token budget, so the next run
goes to ``spare``, where a forced stop (a second signal) cancels it. Both
replay engines end each cancelled attempt as the recording did (exit code
-15, the same spend, a session): the one a request cancelled at its
recorded end, the one the replayed forced stop cancels as the fake runner
stops it, which used to say nothing (no spend, no session, no exit code).
"""

from __future__ import annotations

from pathlib import Path

import trio
from supervisor_support import Running, Start
from test_account_budgets import SUCCESS_TOKENS, agent_config, submit
from test_replay_faults import ENGINES, finishes
from test_replay_shutdowns import replays_the_same


async def hanging(running: Running, home: Path, conversation: str) -> str:
    """Submit a run; wait until its agent (on the account of ``home``) said all and hangs."""
    (home / "hanging").unlink(missing_ok=True)
    run_id: str = (await submit(running, conversation=conversation))["id"]
    with trio.fail_after(20):
        while not (home / "hanging").exists():
            await trio.sleep(0.02)
    return run_id


async def test_cancelled_attempts_replay_with_their_spend_session_and_exit_code(
    start: Start, tmp_path: Path
) -> None:
    tokens = f'window = "5h"\nbudget = {SUCCESS_TOKENS}\nbudget_unit = "tokens"'
    running = await start(agent_config(tmp_path, [("tok", tokens), ("spare", "")]))
    homes = tmp_path / "homes"
    for name in ("tok", "spare"):
        (homes / name / "hang").write_text("")
    asked = await hanging(running, homes / "tok", "c1")
    response = await running.client.post(f"/v1/runs/{asked}/cancel")
    assert response.status_code == 200, response.text
    assert (await running.wait(asked))["status"] == "cancelled"
    # What the cancelled attempt spent is tok's whole budget: the next run goes on.
    forced = await hanging(running, homes / "spare", "c2")
    running.supervisor.request_shutdown()  # drain
    running.supervisor.request_shutdown()  # forced: the hanging run is cancelled
    with trio.fail_after(30):
        await running.stopped.wait()
    [trace] = (tmp_path / "state" / "traces").glob("*.jsonl")

    ended = finishes(trace)
    for run_id, account in ((asked, "tok"), (forced, "spare")):
        [finish] = ended[run_id]
        assert (finish["outcome"], finish["exit_code"], finish["session"]) == (
            "cancelled",
            -15,
            True,
        ), account
        assert finish["spend"]["tokens"]["total"] >= SUCCESS_TOKENS
    await replays_the_same(trace, tmp_path, ENGINES)
    for engine in ENGINES:
        replayed = finishes(tmp_path / f"{trace.stem}-{engine}.jsonl")
        for run_id in (asked, forced):
            [again], [finish] = replayed[run_id], ended[run_id]
            # All but its moments: the replay reads an end as it traces it
            # (no "ended"), the recording a commit earlier.
            moments = {"t": 0, "seq": 0, "ended": 0}
            assert {**again, **moments} == {**finish, **moments}, (engine, run_id)
