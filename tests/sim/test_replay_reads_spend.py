"""A recorded trace whose finish events carry what runs spent replays as one without it."""

from __future__ import annotations

import json
from pathlib import Path

from sim_workloads import herdsman

RECORDED = Path(__file__).parents[2] / "sim" / "demo-recorded.jsonl"
SPEND = {
    "tokens": {
        "input": 12,
        "cache_read": 4096,
        "cache_write": 0,
        "output": 7,
        "reasoning": 0,
        "total": 4115,
    },
    "cost_usd": 0.0123,
    "turns": 1,
    "api_time": 2.5,
    "models": [],
}


def test_finish_events_with_a_spend_replay_to_the_same_decisions(tmp_path: Path) -> None:
    header, *events = RECORDED.read_text().splitlines()
    spent = [header]
    for line in events:
        event = json.loads(line)
        if event["event"] == "finish":
            event["spend"] = SPEND
        spent.append(json.dumps(event, separators=(",", ":"), ensure_ascii=False))
    assert sum('"spend":' in line for line in spent) == 14
    (tmp_path / "spent.jsonl").write_text("\n".join(spent) + "\n")
    plain = herdsman("sim", "replay", str(RECORDED), "--out", "plain.jsonl", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    replayed = herdsman("sim", "replay", "spent.jsonl", "--out", "spent-out.jsonl", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert (tmp_path / "spent-out.jsonl").read_bytes() == (tmp_path / "plain.jsonl").read_bytes()
