"""Fidelity: a recorded run, replayed, starts the same runs in order on the same accounts."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import trio
from supervisor_support import Start, config_at, write_config

from herdsman.sim.decisions import read_decisions
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload


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
