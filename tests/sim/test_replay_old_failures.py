"""Old traces, whose failed finishes name no failure class, replay as recorded and say why.

A trace written before finishes carried ``failure`` (and ``worked``,
``session``, ``spend``) cannot tell a replay which class a failure was of:
guessing one (a crash, say) would retry what the recording's supervisor did
not, or blame a cause nobody saw. The replay retries none of them, whatever
the policy, and its summary says so in one clause naming the first. Built
from sim/faults-recorded.jsonl with those fields taken out: as written after
retries came (``retry`` events still name the class of each retried attempt,
so those are retried as recorded) and before (no retry policy in the header).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import herdsman

from herdsman.sim.decisions import read_decisions
from herdsman.sim.diff import first_divergence

RECORDED = Path(__file__).parents[2] / "sim" / "faults-recorded.jsonl"
#: What a finish written before failure classes did not carry.
NEWER = ("failure", "worked", "session", "spend")


def aged(*, retries: bool) -> tuple[str, list[tuple[str, float]]]:
    """The recording as an older supervisor would have written it; its unclassed failures.

    ``retries``: written after retries came (their events stay); else
    before, so only the runs never retried are kept, and the header's
    providers have no retry policy.
    """
    header, *lines = RECORDED.read_text().splitlines()
    events = [json.loads(line) for line in lines]
    retried = {e["run_id"] for e in events if e["event"] == "retry"}
    head: dict[str, Any] = json.loads(header)
    if not retries:
        for settings in head["config"]["providers"].values():
            del settings["retry"]
    kept, unclassed = [json.dumps(head)], []
    for event in events:
        run_id = event.get("run_id") or event.get("run", {}).get("id")
        if not retries and run_id in retried:
            continue
        if event["event"] == "finish":
            for field in NEWER:
                event.pop(field, None)
            if event["outcome"] == "failed" and not event.get("requeued"):
                unclassed.append((event["run_id"], event["t"]))
        kept.append(json.dumps(event))
    return "\n".join(kept) + "\n", unclassed


@pytest.mark.parametrize("retries", [True, False], ids=["after-retries", "before-retries"])
@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_an_old_trace_s_unclassed_failures_are_not_retried_and_the_summary_says_so(
    tmp_path: Path, engine: str, retries: bool
) -> None:
    text, unclassed = aged(retries=retries)
    (tmp_path / "old.jsonl").write_text(text)
    done = herdsman(
        "sim", "replay", "old.jsonl", "--engine", engine, "--out", "out.jsonl", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    # Every decision is the recorded one: each retried attempt as its retry
    # event says, the others failed for good, as recorded.
    old, out = read_decisions(tmp_path / "old.jsonl"), read_decisions(tmp_path / "out.jsonl")
    assert first_divergence(old, out) is None
    assert len(unclassed) == (2 if retries else 1)
    run_id, at = unclassed[0]
    first = f"(the first: {run_id}'s at t={at:.3f})"
    if retries:
        said = (
            f"; {len(unclassed)} failed attempt(s) {first} name no failure class (a failure"
            " no policy retries, such as billing or a refused request, or a trace written"
            " before finishes named their class): the replay retries none of them"
        )
    else:
        said = (
            f"; the recording predates retries: its {len(unclassed)} failed attempt(s) {first}"
            " name no failure class, so the replay retries none of them"
        )
    assert said in done.stderr
    [summary] = [line for line in done.stderr.splitlines() if line.startswith("replayed ")]
    assert "crash" not in summary
    assert "still queued" not in summary


def test_a_trace_that_names_its_failure_classes_says_nothing_of_them(tmp_path: Path) -> None:
    done = herdsman("sim", "replay", str(RECORDED), "--out", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "name no failure class" not in done.stderr
