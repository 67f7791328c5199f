"""``herdsman sim view``: a trace's runs as the dashboard's timeline draws them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from herdsman.cli import main
from herdsman.runtime.dashboard.trace_view import view_html

START = 1796025600.0  # 2026-11-30T08:00:00Z

TRACE = [
    {"herdsman_trace": 1, "started_at": "2026-11-30T08:00:00.000000Z", "config": {}},
    {
        "t": 1,
        "seq": 0,
        "event": "submit",
        "run": {"id": "r1", "provider": "p", "conversation": "c"},
    },
    {
        "t": 2,
        "seq": 1,
        "event": "submit",
        "run": {"id": "r2", "provider": "p", "conversation": "c"},
    },
    {"t": 3, "seq": 2, "event": "start", "run_id": "r1", "account": "a"},
    {"t": 9, "seq": 3, "event": "finish", "run_id": "r1", "outcome": "succeeded", "exit_code": 0},
    {"t": 10, "seq": 4, "event": "start", "run_id": "r2", "account": "a"},
    {
        "t": 12,
        "seq": 5,
        "event": "finish",
        "run_id": "r2",
        "outcome": "usage_limited",
        "exit_code": 1,
        "requeued": True,
    },
    {"t": 20, "seq": 6, "event": "start", "run_id": "r2", "account": "b"},
    {
        "t": 25,
        "seq": 7,
        "event": "finish",
        "run_id": "r2",
        "outcome": "timed_out",
        "exit_code": -15,
    },
    {"t": 26, "seq": 8, "event": "submit", "run": {"id": "r3", "provider": "p"}},
    {"t": 27, "seq": 9, "event": "cancel", "run_id": "r3"},
    {"t": 28, "seq": 10, "event": "submit", "run": {"id": "r4", "provider": "q"}},
    {"t": 30, "seq": 11, "event": "start", "run_id": "r4", "account": None},
]


def write_trace(path: Path) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in TRACE), encoding="utf-8")
    return path


def embedded(page: str) -> dict[str, object]:
    text = page.split('<script type="application/json" id="trace-data">')[1].split(
        "</script>", maxsplit=1
    )[0]
    data: dict[str, object] = json.loads(text)
    return data


def brief(run: dict[str, object]) -> tuple[object, ...]:
    """The run's id, status, times (from the trace's start) and account."""
    shown: list[object] = []
    for key in ("id", "status", "submitted_at", "started_at", "finished_at", "account"):
        value = run[key]
        shown.append(value - START if isinstance(value, float) else value)
    return tuple(shown)


def test_each_run_is_drawn_from_its_submit_start_and_end(tmp_path: Path) -> None:
    data = embedded(view_html(write_trace(tmp_path / "day.jsonl")))
    assert data["since"] == START
    assert data["until"] == START + 30
    runs = data["runs"]
    assert isinstance(runs, list)
    assert [brief(run) for run in runs] == [
        ("r1", "succeeded", 1, 3, 9, "a"),
        # Requeued after its usage limit: waits again from then, and times out.
        ("r2", "failed", 12, 20, 25, "b"),
        ("r3", "cancelled", 26, None, 27, None),
        ("r4", "running", 28, 30, None, None),
        ("r2 (limited)", "failed", 2, 10, 12, "a"),
    ]
    assert runs[2]["conversation"] == "r3"  # no conversation: a lane of its own
    # Only the attempt is marked, so the page counts runs, not bars.
    assert [run.get("limited", False) for run in runs] == [False] * 4 + [True]


def test_a_prompt_cannot_end_the_pages_script(tmp_path: Path) -> None:
    with_tag = [
        *TRACE[:1],
        {"t": 1, "seq": 0, "event": "submit", "run": {"id": "r1", "provider": "</script><b>"}},
    ]
    path = tmp_path / "odd.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in with_tag), encoding="utf-8")
    page = view_html(path)
    assert "</script><b>" not in page
    assert embedded(page)["runs"][0]["provider"] == "</script><b>"  # type: ignore[index]


def test_sim_view_writes_the_page_and_names_a_bad_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "day.html"
    assert main(["sim", "view", str(write_trace(tmp_path / "day.jsonl")), "--out", str(out)]) == 0
    assert "HerdsmanTimeline" in out.read_text(encoding="utf-8")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    assert main(["sim", "view", str(bad), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"herdsman: {bad}:1:")
    assert len(error.splitlines()) == 1
