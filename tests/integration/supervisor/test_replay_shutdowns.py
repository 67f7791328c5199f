"""Traces of every way the real supervisor stops, replayed: the same decisions, or said why not.

Each test records a trace with the real supervisor (real processes, real
SQLite, real signals where a process is killed), replays it with both
engines where the fast one knows every event, and compares the decisions
as ``sim diff`` does.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path

import pytest
import trio
from cli_support import CLI, Supervisor, herdsman
from supervisor_support import Running, Start, config_at, write_config
from test_accounts import limit, serve_agent, submit
from test_fleet_supervisors import start_members, submit_spread, wait_until_settled

from herdsman.runtime.store.postgres import PostgresStore
from herdsman.sim.decisions import read_decisions
from herdsman.sim.diff import first_divergence
from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.result import ReplayResult, recording_ends, summary
from herdsman.sim.workload import config_from_trace, read_workload

AGENT = Path(__file__).parent / "slow_stop_agent.py"


def slow_stop_provider(ready: Path) -> str:
    """A provider ``slow`` of two slots whose agents take the prompt's seconds to stop."""
    ready.mkdir()
    return f'[providers.slow]\nexec = ["{sys.executable}", "{AGENT}", "{ready}"]\nconcurrency = 2\n'


def replayed(recorded: Path, engine: str, out: Path) -> ReplayResult:
    """``sim replay --engine ENGINE`` of ``recorded`` under its own configuration."""
    workload = read_workload(recorded)
    loaded = config_from_trace(workload.header.config, f"{recorded}:1")
    if engine == "fast":
        result = recording_ends(fast_replay(workload, loaded), workload)
    else:
        result = replay(workload, loaded)
    out.write_text(result.trace)
    return result


async def replays_the_same(recorded: Path, tmp_path: Path, engines: tuple[str, ...]) -> list[str]:
    """Replay ``recorded`` with each engine; every replay agrees with it; their summaries."""
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    lines = []
    for engine in engines:
        out = tmp_path / f"{recorded.stem}-{engine}.jsonl"
        result = await trio.to_thread.run_sync(replayed, recorded, engine, out)
        divergence = first_divergence(read_decisions(recorded), read_decisions(out))
        assert divergence is None, (engine, divergence)
        lines.append(summary(result))
    return lines


async def two_stopping_slowly(running: Running, ready: Path) -> list[str]:
    """Submit f (stops in 1.5 s once told) then g (stops at once); wait until both can be told."""
    body = {
        "runs": [
            {"provider": "slow", "prompt": "1.5", "conversation": "f"},
            {"provider": "slow", "prompt": "0", "conversation": "g"},
            {"provider": "slow", "prompt": "0", "conversation": "h"},
        ]
    }
    response = await running.client.post("/v1/runs/batch", json=body)
    ids = [r["run"]["id"] for r in response.json()["results"]]
    with trio.fail_after(20):
        while not all((ready / run_id).exists() for run_id in ids[:2]):
            await trio.sleep(0.02)
    return ids


def finishes(recorded: Path) -> list[str]:
    return [d.run_id for d in read_decisions(recorded).decisions if d.kind == "finish"]


async def test_a_second_signal_records_the_cancelled_ends_in_submission_order(
    start: Start, tmp_path: Path
) -> None:
    # f takes longer to stop than g: in exit order g would end first.
    ready = tmp_path / "ready"
    config = write_config(tmp_path, concurrency=1, extra_provider=slow_stop_provider(ready))
    running = await start(config_at(config))
    f, g, _ = await two_stopping_slowly(running, ready)
    running.supervisor.request_shutdown()  # drain: h stays queued
    running.supervisor.request_shutdown()  # forced: f and g are cancelled
    with trio.fail_after(30):
        await running.stopped.wait()
    [recorded] = (tmp_path / "state" / "traces").glob("*.jsonl")
    assert finishes(recorded) == [f, g]
    for line in await replays_the_same(recorded, tmp_path, ("trio", "fast")):
        assert "1 run(s) were still queued at the end (the recorded shutdown at t=" in line
        assert "provider is not configured" not in line


async def test_the_grace_running_out_records_the_cancelled_ends_in_submission_order(
    start: Start, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    config = write_config(
        tmp_path, concurrency=1, shutdown_grace="1s", extra_provider=slow_stop_provider(ready)
    )
    running = await start(config_at(config))
    f, g, _ = await two_stopping_slowly(running, ready)
    running.supervisor.request_shutdown()  # one signal: the grace of 1 s runs out
    with trio.fail_after(30):
        await running.stopped.wait()
    [recorded] = (tmp_path / "state" / "traces").glob("*.jsonl")
    assert [e["event"] for e in map(json.loads, recorded.read_text().splitlines()[1:])].count(
        "shutdown"
    ) == 2
    assert finishes(recorded) == [f, g]
    await replays_the_same(recorded, tmp_path, ("trio", "fast"))


@pytest.mark.slow
def test_a_killed_supervisor_and_its_restart_replay_file_by_file(tmp_path: Path) -> None:
    # One slot: f runs, g waits. The supervisor is killed (SIGKILL): its
    # trace just ends. The next one finds f lost, starts g, and is stopped
    # by two SIGINTs, the second cancelling g.
    write_config(tmp_path, concurrency=1, delay=60.0)
    first = Supervisor(tmp_path)
    try:
        ids = []
        for conversation in ("f", "g"):
            submitted = herdsman(
                "submit", *CLI, "-p", "demo", "--conversation", conversation, "go", cwd=tmp_path
            )
            assert submitted.returncode == 0, submitted.stderr
            ids.append(submitted.stdout.strip())
        status_of(ids[0], tmp_path, until="running")
        assert status_of(ids[1], tmp_path) == "queued"
        first.stop(signal.SIGKILL)
    finally:
        first.close()
    second = Supervisor(tmp_path)
    try:
        assert status_of(ids[0], tmp_path) == "lost"
        status_of(ids[1], tmp_path, until="running")
        second.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 20
        while "draining" not in second.output():
            assert time.monotonic() < deadline, second.output()
            time.sleep(0.05)
        assert second.stop(signal.SIGINT) != 0  # stopped after cancelling runs
    finally:
        second.close()
    killed, restarted = sorted((tmp_path / "state" / "traces").glob("*.jsonl"))
    assert finishes(killed) == []
    assert finishes(restarted) == [ids[1]]
    assert [d.kind for d in read_decisions(restarted).decisions][:1] == ["lost"]

    [trio_line, fast_line] = trio.run(replays_the_same, killed, tmp_path, ("trio", "fast"))
    for line in (trio_line, fast_line):
        assert "the recording ends at t=" in line
        assert "never end in the replay" in line
        assert "default duration" not in line
    [line] = trio.run(replays_the_same, restarted, tmp_path, ("trio",))
    # Its recovery records f lost again (replays_the_same compared the
    # decisions, lost ones included), and the summary says so.
    assert line.startswith("replayed 1 runs over "), line
    assert (
        "; the recording begins with 1 run(s) found lost at start-up (left running by the"
        " supervisor before it): the replay puts them in its ledger as running, and its"
        " recovery records them lost as the recorded one did (they are not among the runs"
        " replayed)"
    ) in line
    assert "fast engine" not in line
    # The fast engine has no ledger to recover from: it says so, in one line.
    fast = summary(replayed(restarted, "fast", tmp_path / "fast.jsonl"))
    assert "begins with 1 run(s) found lost at start-up, which the fast engine" in fast


def status_of(run_id: str, cwd: Path, until: str | None = None) -> str:
    """``herdsman runs RUN_ID --json``'s status, once it is ``until`` if given."""
    deadline = time.monotonic() + 30
    while True:
        shown = herdsman("runs", *CLI, run_id, "--json", cwd=cwd)
        assert shown.returncode == 0, shown.stderr
        status: str = json.loads(shown.stdout)["status"]
        if until is None or status == until:
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


async def test_usage_limits_rests_and_a_rest_ended_by_hand_replay_with_their_decisions(
    start: Start, tmp_path: Path
) -> None:
    running = await serve_agent(start, tmp_path, "claude-epoch", [("a", ""), ("b", "")])
    # a's limit moves the run to b; then both rest and the next run waits
    # for a to come back (a reset of 2 s), then a rest is ended by hand.
    limit(tmp_path, "a", resets_in=2, until=time.time() + 1)
    moved = await running.wait((await submit(running, conversation="c1"))["id"], 30)
    assert (moved["status"], moved["account"]) == ("succeeded", "b")
    limit(tmp_path, "b", resets_in=3600)
    waited = await running.wait((await submit(running, conversation="c2"))["id"], 30)
    assert (waited["status"], waited["attempts"]) == ("succeeded", 2)
    (tmp_path / "homes" / "b" / "limited").unlink()
    answer = await running.client.post(
        "/v1/accounts/end-rest", json={"provider": "agent", "account": "b"}
    )
    assert answer.status_code == 200, answer.text
    last = await running.wait((await submit(running, conversation="c3"))["id"], 30)
    assert last["status"] == "succeeded"
    running.supervisor.request_shutdown()
    with trio.fail_after(30):
        await running.stopped.wait()
    [recorded] = (tmp_path / "state" / "traces").glob("*.jsonl")
    kinds = {e["event"] for e in map(json.loads, recorded.read_text().splitlines()[1:])}
    assert kinds >= {"usage_limit", "rest_ended"}
    await replays_the_same(recorded, tmp_path, ("trio", "fast"))


def test_a_fleet_member_s_trace_says_why_its_replay_decides_for_itself(
    tmp_path: Path, fleet_url: str, postgres_url: str, closing: list[Supervisor]
) -> None:
    closing += start_members(tmp_path, fleet_url, 2, delay=0.2)
    ids = submit_spread(closing, 8)
    store = PostgresStore(postgres_url)
    try:
        wait_until_settled(store, ids, timeout=60)
    finally:
        store.close()
    for member in closing:
        assert member.stop(signal.SIGTERM) == 0, member.output()
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    for member in closing:
        [recorded] = (member.directory / "state" / "traces").glob("*.jsonl")
        decisions = read_decisions(recorded)
        started = {d.run_id for d in decisions.decisions if d.kind == "start"}
        others = len(set(decisions.providers) - started)
        line = summary(replayed(recorded, "trio", tmp_path / f"{member.directory.name}.jsonl"))
        assert f"this is a fleet member's trace: {others} run(s) submitted in it" in line
