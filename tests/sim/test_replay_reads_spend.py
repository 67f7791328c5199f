"""A recorded trace's finish events carry what each run spent: a replay charges it to budgets.

The recorded demo (sim/demo-recorded.jsonl) put three runs on each of the
accounts ``a`` and ``b`` of its provider ``second``. Given a dollar budget
on ``a`` that two runs spend, and a spend on every finish, its replay moves
the third of ``a``'s runs to ``b``, as the supervisor would have; the same
trace with no spend on its finishes keeps all three on ``a`` (a budget
counts only what the streams reported).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim_workloads import herdsman

from herdsman.sim.decisions import read_decisions

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
#: Two runs' spend (0.0246) reach it; one run's does not.
BUDGET = 0.02


def budgeted(spent: bool) -> str:
    """The recorded demo, a usd budget on account ``a``; ``spent``: a spend on each finish."""
    header, *events = RECORDED.read_text().splitlines()
    head: dict[str, Any] = json.loads(header)
    second = head["config"]["providers"]["second"]
    second["protocol"] = "claude"  # a stream that states a cost (a plain one states none)
    for account in second["accounts"]:
        if account["name"] == "a":
            account.update(window="5h", budget=BUDGET, budget_unit="usd")
    lines = [json.dumps(head, separators=(",", ":"))]
    for line in events:
        event = json.loads(line)
        if spent and event["event"] == "finish":
            event["spend"] = SPEND
        lines.append(json.dumps(event, separators=(",", ":"), ensure_ascii=False))
    return "\n".join(lines) + "\n"


def accounts_started(path: Path) -> list[object]:
    return [dict(d.what)["account"] for d in read_decisions(path).decisions if d.kind == "start"]


def test_a_recorded_spend_is_charged_to_a_usd_budget_in_the_replay(tmp_path: Path) -> None:
    assert accounts_started(RECORDED).count("a") == 3
    for name, with_spend in (("spent", True), ("plain", False)):
        (tmp_path / f"{name}.jsonl").write_text(budgeted(with_spend))
        out = f"{name}-out.jsonl"
        done = herdsman("sim", "replay", f"{name}.jsonl", "--out", out, cwd=tmp_path)
        assert done.returncode == 0, done.stderr

    # Nothing reported spent: the budget counts nothing, a takes its three runs.
    assert accounts_started(tmp_path / "plain-out.jsonl") == accounts_started(RECORDED)
    # Spent: a stops at its budget (two runs), the third goes to b.
    spent = accounts_started(tmp_path / "spent-out.jsonl")
    assert (spent.count("a"), spent.count("b")) == (2, 4)
    # Every replayed finish records the spend its recorded finish carried.
    finishes = [
        json.loads(line)
        for line in (tmp_path / "spent-out.jsonl").read_text().splitlines()[1:]
        if '"event":"finish"' in line
    ]
    assert len(finishes) == 14
    assert all(finish["spend"] == SPEND for finish in finishes)


def test_a_forced_stop_s_cancelled_attempts_replay_with_their_recorded_spend(
    tmp_path: Path,
) -> None:
    """The replayed forced stop cancels each running attempt as the recording ended it."""
    recorded = RECORDED.with_name("stop-forced.jsonl")
    header, *events = recorded.read_text().splitlines()
    lines, cancelled = [header], {}
    for line in events:
        event = json.loads(line)
        if event["event"] == "finish" and event["outcome"] == "cancelled":
            event["spend"] = SPEND
            cancelled[event["run_id"]] = event["exit_code"]
        lines.append(json.dumps(event, separators=(",", ":"), ensure_ascii=False))
    (tmp_path / "spent.jsonl").write_text("\n".join(lines) + "\n")
    assert cancelled
    assert all(code == -15 for code in cancelled.values())
    for engine in ("trio", "fast"):
        out = tmp_path / f"{engine}.jsonl"
        done = herdsman(
            "sim", "replay", "spent.jsonl", "--engine", engine, "--out", out.name, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        replayed = {
            event["run_id"]: event
            for event in map(json.loads, out.read_text().splitlines()[1:])
            if event["event"] == "finish" and event["run_id"] in cancelled
        }
        got = {run_id: (e["exit_code"], e.get("spend")) for run_id, e in replayed.items()}
        assert got == dict.fromkeys(cancelled, (-15, SPEND)), engine
