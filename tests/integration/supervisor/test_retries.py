"""Retries end to end: a real supervisor, real processes printing the CLIs' recorded streams.

``retry_agent.py`` fails attempt by attempt as each run's prompt says, with
the exact streams of tests/fixtures/agent_streams (529 overloaded, 429 with
no reset, a crash, a tool call then a 529), then succeeds; it records every
attempt that reached it, so these tests see both what herdsman decided and
what the agent got.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from supervisor_support import Running, Start, config_at, write_config

from herdsman.trace import read_trace

AGENT = Path(__file__).with_name("retry_agent.py")
#: The session the recorded 529 stream reports: a retry resumes it.
OVERLOADED_SESSION = "ab3d87fd-3b91-4daa-868b-3fe90486cc3b"


def agent_block(tmp_path: Path, retry: str, concurrency: int = 1) -> str:
    """``[providers.agent]`` running retry_agent.py, with ``retry`` as its retry table's body."""
    records = tmp_path / "records.jsonl"
    return (
        "[providers.agent]\n"
        f'exec = ["{sys.executable}", "{AGENT}", "{records}"]\n'
        'protocol = "claude"\n'
        f"concurrency = {concurrency}\n"
        'resume_args = ["--resume", "{session}"]\n'
        "[providers.agent.retry]\n"
        f"{retry}\n"
    )


async def serve(start: Start, tmp_path: Path, retry: str = "", concurrency: int = 1) -> Running:
    block = agent_block(tmp_path, retry or 'backoff = "1s"\nbackoff_max = "1s"', concurrency)
    return await start(config_at(write_config(tmp_path, extra="\n" + block)))


async def submit(running: Running, endings: str, **fields: Any) -> str:
    body = {"provider": "agent", "prompt": endings, **fields}
    response = await running.client.post("/v1/runs", json=body)
    assert response.status_code in (200, 201), response.text
    run_id: str = response.json()["id"]
    return run_id


def records(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "records.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


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


async def test_a_fan_out_lost_to_529_and_429_is_retried_by_default_and_succeeds(
    start: Start, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herdsman.supervisor")
    running = await serve(start, tmp_path, concurrency=2)
    overloaded = await submit(running, "overloaded,success")
    limited = await submit(running, "rate_limited,success")
    crashed = await submit(running, "crash,success")
    done = {run_id: await running.wait(run_id, 30) for run_id in (overloaded, limited, crashed)}

    for run_id, failure in ((overloaded, "overloaded"), (limited, "rate_limit")):
        run = done[run_id]
        assert (run["status"], run["attempts"]) == ("succeeded", 2), run
        [earlier] = run["earlier_attempts"]
        assert (earlier["attempt"], earlier["status"], earlier["failure"]) == (1, "failed", failure)
        assert earlier["exit_code"] == 1
        # Waited out its backoff (1s, jittered to between half of it and all).
        assert earlier["retry_at"] - earlier["finished_at"] >= 0.5
        assert run["started_at"] >= earlier["retry_at"]
        assert any(f"attempt 1 failed ({failure})" in note for note in run["notes"]), run
    # A crash is not retried by default: it may fail the same way again.
    assert (done[crashed]["status"], done[crashed]["attempts"]) == ("failed", 1)
    assert done[crashed]["earlier_attempts"] == []
    endings = sorted((r["run_id"], r["ending"]) for r in records(tmp_path))
    assert endings == sorted(
        [
            (overloaded, "overloaded"),
            (overloaded, "success"),
            (limited, "rate_limited"),
            (limited, "success"),
            (crashed, "crash"),
        ]
    )

    # The log and the note say the delay the run really waited, as jittered
    # (between 0.5s and 1s here), and when its wait ended: not the 1s backoff.
    overloaded_attempt = done[overloaded]["earlier_attempts"][0]
    waited = overloaded_attempt["retry_at"] - overloaded_attempt["finished_at"]
    said = f"attempt 1 failed (overloaded); retrying in {waited:.2f}s, at "
    assert any(said in message for message in caplog.messages), caplog.messages
    ends = time.strftime("%H:%M:%S", time.localtime(overloaded_attempt["retry_at"]))
    assert any(said + time.strftime("%Y-%m-%d ") in m and ends in m for m in caplog.messages)
    assert f"retried in {waited:.2f}s, at " in done[overloaded]["notes"][0]

    # `herdsman runs ID` shows the earlier attempt.
    shown = await trio.to_thread.run_sync(partial(herdsman_in, tmp_path, "runs", overloaded))
    assert shown.returncode == 0, shown.stderr
    assert "1: failed (overloaded), exit 1" in shown.stdout, shown.stdout

    # The trace has each retry, just before its attempt's finish, re-queued
    # (read once the supervisor stopped: the trace is buffered meanwhile).
    running.supervisor.request_shutdown()
    await running.stopped.wait()
    _, read = read_trace(next((tmp_path / "state" / "traces").glob("*.jsonl")))
    events = list(read)
    retries = [e for e in events if e.event == "retry"]
    assert sorted(
        (e.fields["run_id"], e.fields["attempt"], e.fields["failure"]) for e in retries
    ) == sorted([(overloaded, 1, "overloaded"), (limited, 1, "rate_limit")])
    for retry in retries:
        later = [
            e
            for e in events
            if e.seq > retry.seq and e.fields.get("run_id") == retry.fields["run_id"]
        ]
        assert (later[0].event, later[0].fields.get("requeued")) == ("finish", True)


async def test_a_retried_run_keeps_the_head_of_its_conversations_lane_and_resumes_its_session(
    start: Start, tmp_path: Path
) -> None:
    running = await serve(start, tmp_path)
    first = await submit(running, "overloaded,success", conversation="c")
    later = await submit(running, "success", conversation="c")
    other = await submit(running, "success", conversation="d")
    done = [await running.wait(run_id, 30) for run_id in (first, later, other)]
    assert [run["status"] for run in done] == ["succeeded"] * 3
    # The slot is free during the backoff (another conversation's run takes
    # it), the lane is not: the conversation's later run waits for the retry.
    assert [r["run_id"] for r in records(tmp_path)] == [first, other, first, later]
    # The retry resumes the session its failed attempt reported.
    assert [r["args"] for r in records(tmp_path) if r["run_id"] == first] == [
        [],
        ["--resume", OVERLOADED_SESSION],
    ]
    assert done[1]["started_at"] >= done[0]["finished_at"]


async def test_a_run_whose_agent_called_a_tool_is_not_retried(start: Start, tmp_path: Path) -> None:
    running = await serve(start, tmp_path)
    run = await running.wait(await submit(running, "tool_then_overloaded,success"), 30)
    assert (run["status"], run["attempts"], run["earlier_attempts"]) == ("failed", 1, [])
    assert [r["ending"] for r in records(tmp_path)] == ["tool_then_overloaded"]


async def test_after_work_and_crash_retry_when_the_configuration_says_so(
    start: Start, tmp_path: Path
) -> None:
    retry = (
        'on = ["overloaded", "crash"]\nafter_work = ["overloaded"]\n'
        'backoff = "1s"\nbackoff_max = "1s"'
    )
    running = await serve(start, tmp_path, retry, concurrency=2)
    worked = await submit(running, "tool_then_overloaded,success")
    crashed = await submit(running, "crash,success")
    done = [await running.wait(run_id, 30) for run_id in (worked, crashed)]
    assert [(r["status"], r["attempts"]) for r in done] == [("succeeded", 2)] * 2
    assert [r["earlier_attempts"][0]["failure"] for r in done] == ["overloaded", "crash"]


async def test_attempts_bound_the_retries(start: Start, tmp_path: Path) -> None:
    running = await serve(start, tmp_path, 'attempts = 3\nbackoff = "1s"\nbackoff_max = "1s"')
    run = await running.wait(await submit(running, "overloaded"), 30)
    assert (run["status"], run["attempts"]) == ("failed", 3)
    assert [a["attempt"] for a in run["earlier_attempts"]] == [1, 2]
    assert len(records(tmp_path)) == 3


async def test_a_cancel_during_the_backoff_withdraws_the_run_and_frees_its_lane(
    start: Start, tmp_path: Path
) -> None:
    running = await serve(start, tmp_path, 'backoff = "1h"\nbackoff_max = "1h"')
    first = await submit(running, "overloaded,success", conversation="c")
    with trio.fail_after(30):
        while not (await running.client.get(f"/v1/runs/{first}")).json()["earlier_attempts"]:
            await trio.sleep(0.05)
    waiting = (await running.client.get(f"/v1/runs/{first}")).json()
    assert (waiting["status"], waiting["attempts"]) == ("queued", 1)
    later = await submit(running, "success", conversation="c")
    assert (await running.client.get(f"/v1/runs/{later}")).json()["status"] == "queued"

    # Status counts the run waiting to retry as queued, says it apart, and
    # does not call it parked (a fleet member's refused claim).
    status = (await running.client.get("/v1/status")).json()
    assert (status["queued"], status["retrying"], status["parked"]) == (2, 1, 0), status
    assert status["queued_by_provider"] == {"agent": 2}
    assert (status["retrying_by_provider"], status["parked_by_provider"]) == ({"agent": 1}, {})
    earlier = waiting["earlier_attempts"][0]
    assert status["next_retry_at"] == earlier["retry_at"]
    shown = await trio.to_thread.run_sync(partial(herdsman_in, tmp_path, "status"))
    assert shown.returncode == 0, shown.stderr
    due = time.strftime("%H:%M:%S", time.localtime(earlier["retry_at"]))
    assert f"queued: 2 (1 waiting to retry, the first at {due})" in shown.stdout, shown.stdout
    assert "parked" not in shown.stdout
    [agent_row] = [line for line in shown.stdout.splitlines() if line.startswith("agent ")]
    assert agent_row.split()[-3:] == ["2", "(1", "retrying)"], shown.stdout

    cancelled = await running.client.post(f"/v1/runs/{first}/cancel")
    assert cancelled.json()["status"] == "cancelled", cancelled.text
    assert (await running.wait(later, 30))["status"] == "succeeded"
    assert [r["run_id"] for r in records(tmp_path)] == [first, later]


async def test_a_shutdown_during_the_backoff_leaves_the_run_queued_for_the_next_start(
    start: Start, tmp_path: Path
) -> None:
    block = agent_block(tmp_path, 'backoff = "1h"\nbackoff_max = "1h"')
    config = config_at(write_config(tmp_path, extra="\n" + block))
    running = await start(config)
    run_id = await submit(running, "overloaded,success", conversation="c")
    with trio.fail_after(30):
        while not (await running.client.get(f"/v1/runs/{run_id}")).json()["earlier_attempts"]:
            await trio.sleep(0.05)
    # The shutdown does not wait out the backoff.
    running.supervisor.request_shutdown()
    with trio.fail_after(30):
        await running.stopped.wait()

    again = await start(config)
    run = await again.wait(run_id, 30)
    assert (run["status"], run["attempts"]) == ("succeeded", 2)
    assert [a["failure"] for a in run["earlier_attempts"]] == ["overloaded"]
    assert [r["args"] for r in records(tmp_path)] == [[], ["--resume", OVERLOADED_SESSION]]
