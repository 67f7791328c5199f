"""Fidelity: a recorded run, replayed, starts the same runs in order on the same accounts."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import trio
from supervisor_support import Start, config_at, write_config

from herdsman.sim.decisions import Timeline, read_decisions
from herdsman.sim.diff import first_divergence
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload
from herdsman.trace import read_trace


async def test_a_recorded_run_replays_with_the_same_starts_and_accounts(
    start: Start, tmp_path: Path
) -> None:
    demo = f'["{sys.executable}", "-m", "herdsman.demo_agent", "--delay", "0.4"]'
    second = (
        f"[providers.second]\nexec = {demo}\nconcurrency = 2\n"
        '[[providers.second.accounts]]\nname = "a"\nconcurrency = 1\n'
        '[[providers.second.accounts]]\nname = "b"\nconcurrency = 1\n'
    )
    running = await start(config_at(write_config(tmp_path, delay=0.4, extra=second)))

    async def batch(provider: str, conversations: list[str]) -> list[str]:
        body = {
            "runs": [
                {"provider": provider, "prompt": "go", "conversation": c} for c in conversations
            ]
        }
        response = await running.client.post("/v1/runs/batch", json=body)
        assert response.status_code == 200, response.text
        return [r["run"]["id"] for r in response.json()["results"]]

    # Two providers, several conversations, two slots each; the second
    # provider's events fall between the first's, never on them.
    ids = await batch("demo", ["x0", "x1", "x0", "x2", "x1", "x3", "x3", "x2"])
    await trio.sleep(0.2)
    ids += await batch("second", ["y0", "y1", "y0", "y2", "y1", "y2"])
    for run_id in ids:
        assert (await running.wait(run_id, 60))["status"] == "succeeded"
    running.supervisor.request_shutdown()
    with trio.fail_after(20):
        await running.stopped.wait()

    [recorded] = (tmp_path / "state" / "traces").glob("*.jsonl")
    # Each finish says when its end was read: before its line, written once
    # the ledger's thread had committed it (the reader holds it to that).
    ends = [e.fields for e in read_trace(recorded)[1] if e.event == "finish"]
    assert len(ends) == len(ids)
    assert any("ended" in fields for fields in ends)
    # Each start says when it was decided, before the ledger's thread committed it.
    begun = [e.fields for e in read_trace(recorded)[1] if e.event == "start"]
    assert any("decided" in fields for fields in begun)
    workload = read_workload(recorded)
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    result = await trio.to_thread.run_sync(
        lambda: replay(workload, config_from_trace(workload.header.config, "header"))
    )
    replayed = tmp_path / "replayed.jsonl"
    replayed.write_text(result.trace)

    def starts(path: Path) -> list[tuple[str, object]]:
        return [
            (d.run_id, dict(d.what)["account"])
            for d in read_decisions(path).decisions
            if d.kind == "start"
        ]

    assert len(starts(recorded)) == len(ids)
    assert starts(replayed) == starts(recorded)
    assert {account for _, account in starts(recorded)} == {None, "a", "b"}
    # The finishes too, in the same order: each run ends at its recorded
    # moment, so two close finishes never come out swapped.
    assert first_divergence(read_decisions(recorded), read_decisions(replayed)) is None


async def test_each_trace_file_of_a_drain_and_restart_replays_on_its_own(
    start: Start, tmp_path: Path
) -> None:
    config = config_at(write_config(tmp_path, concurrency=1, delay=0.5))
    first = await start(config)
    body = {"runs": [{"provider": "demo", "prompt": "go", "conversation": "c"} for _ in range(3)]}
    ids = [
        r["run"]["id"]
        for r in (await first.client.post("/v1/runs/batch", json=body)).json()["results"]
    ]
    with trio.fail_after(10):
        while (await first.client.get(f"/v1/runs/{ids[0]}")).json()["status"] != "running":
            await trio.sleep(0.02)
    first.supervisor.request_shutdown()  # drain: the first run finishes, two stay queued
    with trio.fail_after(20):
        await first.stopped.wait()
    second = await start(config)
    for run_id in ids[1:]:
        assert (await second.wait(run_id, 30))["status"] == "succeeded"
    second.supervisor.request_shutdown()
    with trio.fail_after(20):
        await second.stopped.wait()

    logging.getLogger("herdsman").setLevel(logging.ERROR)
    files = sorted((tmp_path / "state" / "traces").glob("*.jsonl"))
    assert len(files) == 2
    for recorded in files:
        await replays_the_same(recorded, tmp_path)
    # The first file stops starting at the drain; the second starts the rest.
    starts = [[d.run_id for d in read_decisions(f).decisions if d.kind == "start"] for f in files]
    assert starts == [ids[:1], ids[1:]]


@pytest.mark.slow
async def test_each_rotated_trace_file_replays_on_its_own(start: Start, tmp_path: Path) -> None:
    # The smallest rotation size: files turn over while runs are running
    # and queued, which each new header must restate. One slot: two runs
    # ending within a fraction of a millisecond would be recorded in an
    # order the replay (where a start takes no time) need not reproduce.
    # Where a file turns over depends on the bytes before it (the paths and
    # the settings in each header): enough runs to make several files, so
    # that some turn over between a start and its finish whatever the sizes.
    config = config_at(write_config(tmp_path, concurrency=1, delay=0.2, extra=TINY_TRACE))
    running = await start(config)
    conversations = [f"c{n % 4}" for n in range(32)]
    runs = [{"provider": "demo", "prompt": "go", "conversation": c} for c in conversations]
    body = {"runs": runs}
    response = await running.client.post("/v1/runs/batch", json=body)
    ids = [r["run"]["id"] for r in response.json()["results"]]
    for run_id in ids:
        assert (await running.wait(run_id, 60))["status"] == "succeeded"
    running.supervisor.request_shutdown()
    with trio.fail_after(20):
        await running.stopped.wait()

    logging.getLogger("herdsman").setLevel(logging.ERROR)
    files = sorted((tmp_path / "state" / "traces").glob("*.jsonl"), key=_file_number)
    carries = [read_workload(f).header.carry for f in files]
    assert carries[0] is None
    assert any(c and c["running"] for c in carries[1:]), "no file began with runs running"
    assert any(c and c["queued"] for c in carries[1:]), "no file began with runs queued"
    started: list[str] = []
    for recorded in files:
        a = await replays_the_same(recorded, tmp_path)
        workload = read_workload(recorded)
        carried = {held["run"]["id"] for held in (workload.header.carry or {}).get("running", [])}
        started += [d.run_id for d in a.decisions if d.kind == "start" and d.run_id not in carried]
    assert sorted(started) == sorted(ids)


TINY_TRACE = "[trace]\nmax_bytes = 4096\n"


def _file_number(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


async def replays_the_same(recorded: Path, tmp_path: Path) -> Timeline:
    """Replay one trace file on its own; its decisions, once the replay is seen to agree."""
    workload = read_workload(recorded)
    result = await trio.to_thread.run_sync(
        lambda: replay(workload, config_from_trace(workload.header.config, "header"))
    )
    replayed = tmp_path / f"replayed-{recorded.name}"
    replayed.write_text(result.trace)
    a, b = read_decisions(recorded), read_decisions(replayed)
    assert first_divergence(a, b) is None, recorded
    return a
