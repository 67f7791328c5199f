"""``herdsman sim replay`` and ``herdsman sim diff`` as a user runs them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from sim_workloads import CONFIG, busy_trace, herdsman


def test_replay_writes_a_trace_a_summary_and_a_chrome_timeline(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=40)
    done = herdsman("sim", "replay", str(trace), "--chrome-trace", "timeline.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert json.loads(lines[0])["herdsman_trace"] == 1
    assert done.stderr.startswith("replayed 40 runs over ")
    assert "runs per wall second" in done.stderr
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    runs = [e for e in timeline["traceEvents"] if e["ph"] == "X"]
    finished = [json.loads(line) for line in lines[1:]]
    assert len(runs) == sum(1 for e in finished if e["event"] == "finish")
    providers = {e["args"]["name"] for e in timeline["traceEvents"] if e["name"] == "process_name"}
    assert providers == {"claude", "codex"}
    # No slot ever holds two runs at once.
    by_row: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for run in runs:
        by_row.setdefault((run["pid"], run["tid"]), []).append((run["ts"], run["ts"] + run["dur"]))
    for spans in by_row.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


@pytest.mark.parametrize("flag", ["--out", "--chrome-trace"])
def test_an_output_in_a_missing_folder_is_refused_before_the_replay(
    tmp_path: Path, flag: str
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=4)
    missing = tmp_path / "missing" / "out.json"
    done = herdsman("sim", "replay", str(trace), flag, str(missing), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""  # no trace written first
    assert done.stderr == f"herdsman: {flag} {missing}: no such directory {missing.parent}\n"


@pytest.mark.slow
def test_a_what_if_config_changes_decisions_and_diff_finds_the_first(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=40)
    assert herdsman("sim", "replay", str(trace), "--out", "a.jsonl", cwd=tmp_path).returncode == 0
    (tmp_path / "what-if.toml").write_text(
        CONFIG.replace("max_concurrency = 4", "max_concurrency = 1")
    )
    what_if = herdsman(
        "sim", "replay", str(trace), "-c", "what-if.toml", "--out", "b.jsonl", cwd=tmp_path
    )
    assert what_if.returncode == 0, what_if.stderr
    same = herdsman("sim", "diff", "a.jsonl", "a.jsonl", cwd=tmp_path)
    assert (same.returncode, same.stdout.split()[:3]) == (0, ["the", "traces", "agree"])
    differ = herdsman("sim", "diff", "a.jsonl", "b.jsonl", cwd=tmp_path)
    assert differ.returncode == 1
    first, expected, actual = differ.stdout.splitlines()[:3]
    assert first.startswith("the traces diverge at decision ")
    assert expected.startswith("  a.jsonl: t=")
    assert actual.startswith("  b.jsonl: t=")


def test_a_malformed_trace_is_one_line_naming_file_and_line(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=5)
    lines = trace.read_text().splitlines()
    lines[3] = lines[3].replace('"t": ', '"t": "soon", "x": ')
    trace.write_text("\n".join(lines) + "\n")
    failed = herdsman("sim", "replay", str(trace), cwd=tmp_path)
    assert failed.returncode == 2
    assert failed.stderr.startswith(f"herdsman: {trace}:4: ")
    assert "Traceback" not in failed.stderr
    missing = herdsman("sim", "diff", "nope.jsonl", str(trace), cwd=tmp_path)
    assert missing.returncode == 2
    assert "nope.jsonl" in missing.stderr
    assert "Traceback" not in missing.stderr


@pytest.mark.slow
def test_set_makes_a_what_if_of_the_traces_own_config_and_recorded_reloads_are_left_out(
    tmp_path: Path,
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=60)
    assert herdsman("sim", "replay", str(trace), "--out", "a.jsonl", cwd=tmp_path).returncode == 0
    what_if = herdsman(
        "sim",
        "replay",
        str(trace),
        "--set",
        "supervisor.max_concurrency=1",
        "--out",
        "b.jsonl",
        cwd=tmp_path,
    )
    assert what_if.returncode == 0, what_if.stderr
    assert "the trace's 1 reload(s) are not replayed" in what_if.stderr
    header = json.loads((tmp_path / "b.jsonl").read_text().splitlines()[0])
    assert header["config"]["supervisor"]["max_concurrency"] == 1
    assert '"event":"reload"' not in (tmp_path / "b.jsonl").read_text()
    assert herdsman("sim", "diff", "a.jsonl", "b.jsonl", cwd=tmp_path).returncode == 1


@pytest.mark.slow
def test_a_synthetic_run_tried_again_is_not_reported_as_never_started(tmp_path: Path) -> None:
    done = herdsman("sim", "replay", str(busy_trace(tmp_path / "busy.jsonl")), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "usage_limit" in done.stdout
    assert "never started" not in done.stderr


BAD_LINES = {
    "infinite duration": (
        '{"t": 1, "seq": 0, "event": "submit", "run": {"id": "r", "provider": "claude"},'
        ' "duration": 1e999}',
        "2: duration: expected seconds >= 0, got inf",
    ),
    "infinite time": (
        '{"t": 1e999, "seq": 0, "event": "cancel", "run_id": "r"}',
        "2: t: expected seconds >= 0, got inf",
    ),
    "until not a time": (
        '{"t": 1, "seq": 0, "event": "usage_limit", "run_id": "r", "provider": "claude",'
        ' "account": null, "until": "soon"}',
        "2: until: expected unix seconds, got 'soon'",
    ),
    "unknown outcome": (
        '{"t": 1, "seq": 0, "event": "finish", "run_id": "r", "outcome": "exploded"}',
        "2: outcome: expected one of succeeded, failed, timed_out, cancelled, usage_limited,"
        " got 'exploded'",
    ),
    "bad reload config": (
        '{"t": 1, "seq": 0, "event": "reload", "generation": 2, "config": {"providers": 5}}',
        "2: config: providers:",
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_LINES))
def test_a_bad_value_is_one_line_naming_file_line_and_field(tmp_path: Path, kind: str) -> None:
    line, expected = BAD_LINES[kind]
    header = (busy_trace(tmp_path / "ok.jsonl", runs=1)).read_text().splitlines()[0]
    trace = tmp_path / "bad.jsonl"
    trace.write_text(header + "\n" + line + "\n")
    failed = herdsman("sim", "replay", str(trace), cwd=tmp_path)
    assert failed.returncode == 2, failed.stderr
    assert failed.stderr.startswith(f"herdsman: {trace}:{expected}"), failed.stderr
    assert "Traceback" not in failed.stderr


def test_a_header_time_without_a_zone_is_refused(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "t.jsonl", runs=1)
    trace.write_text(trace.read_text().replace("00.000000Z", "00.000000", 1))
    failed = herdsman("sim", "replay", str(trace), cwd=tmp_path)
    assert failed.returncode == 2
    assert f"{trace}:1: started_at: expected an ISO-8601 time with a zone" in failed.stderr


def test_the_summary_counts_accepted_runs_and_warns_about_runs_left_queued(
    tmp_path: Path,
) -> None:
    header = (busy_trace(tmp_path / "ok.jsonl", runs=1)).read_text().splitlines()[0]
    lines = [
        '{"t": 1, "seq": 0, "event": "submit", "run": {"id": "a", "provider": "claude"},'
        ' "duration": 1}',
        '{"t": 2, "seq": 1, "event": "submit", "run": {"id": "a", "provider": "claude"},'
        ' "duration": 1}',
        '{"t": 3, "seq": 2, "event": "submit", "run": {"id": "b", "provider": "gone"},'
        ' "duration": 1}',
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([header, *lines]) + "\n")
    done = herdsman("sim", "replay", str(trace), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("replayed 2 runs ")
    assert "1 run(s) were still queued at the end" in done.stderr


@pytest.mark.slow
def test_diff_compares_a_rotated_file_only_as_far_as_it_goes(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=20)
    assert herdsman("sim", "replay", str(trace), "--out", "a.jsonl", cwd=tmp_path).returncode == 0
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    # The same recording cut short by a rotation, and cut short without one.
    cut = len(lines) // 2
    # Rotated when the next line was to be written: at its time.
    at = json.loads(lines[cut])["t"]
    rotated = json.dumps({"t": at, "seq": 999, "event": "rotated", "next": "trace-2.jsonl"})
    (tmp_path / "rotated.jsonl").write_text("\n".join([*lines[:cut], rotated]) + "\n")
    (tmp_path / "short.jsonl").write_text("\n".join(lines[:cut]) + "\n")
    agreed = herdsman("sim", "diff", "rotated.jsonl", "a.jsonl", cwd=tmp_path)
    assert agreed.returncode == 0, agreed.stdout
    assert "rotated.jsonl was rotated" in agreed.stdout
    assert herdsman("sim", "diff", "a.jsonl", "rotated.jsonl", cwd=tmp_path).returncode == 0
    assert herdsman("sim", "diff", "short.jsonl", "a.jsonl", cwd=tmp_path).returncode == 1


@pytest.mark.slow
def test_the_fast_engine_writes_what_the_trio_replay_writes(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=60)
    slow = herdsman("sim", "replay", str(trace), "--out", "trio.jsonl", cwd=tmp_path)
    fast = herdsman(
        "sim", "replay", str(trace), "--engine", "fast", "--out", "fast.jsonl", cwd=tmp_path
    )
    assert (slow.returncode, fast.returncode) == (0, 0), slow.stderr + fast.stderr
    assert fast.stderr.startswith("replayed 60 runs with the fast engine over ")
    assert (tmp_path / "fast.jsonl").read_bytes() == (tmp_path / "trio.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--engine", "quick"], "argument --engine: invalid choice: 'quick' (choose from"),
        (["--engine", "fast", "--seed", "3"], "--seed reshuffles trio's wake-up order"),
    ],
)
def test_a_wrong_engine_flag_is_refused_with_what_would_be_right(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=5)
    done = herdsman("sim", "replay", str(trace), *flags, cwd=tmp_path)
    assert done.returncode == 2
    assert said in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_diff_json_carries_the_divergence_as_data(tmp_path: Path) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=20)
    assert herdsman("sim", "replay", str(trace), "--out", "a.jsonl", cwd=tmp_path).returncode == 0
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    cut = len(lines) // 2
    (tmp_path / "short.jsonl").write_text("\n".join(lines[:cut]) + "\n")
    same = herdsman("sim", "diff", "--json", "a.jsonl", "a.jsonl", cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    agreed = json.loads(same.stdout)
    assert agreed["agree"] is True
    assert agreed["divergence"] is None
    assert agreed["rotated"] == []
    assert (agreed["expected"], agreed["actual"]) == ("a.jsonl", "a.jsonl")
    text = herdsman("sim", "diff", "a.jsonl", "a.jsonl", cwd=tmp_path).stdout
    assert f"all {agreed['compared']} decisions" in text

    differ = herdsman("sim", "diff", "short.jsonl", "a.jsonl", "--json", cwd=tmp_path)
    assert differ.returncode == 1, differ.stderr
    found = json.loads(differ.stdout)["divergence"]
    said = herdsman("sim", "diff", "short.jsonl", "a.jsonl", cwd=tmp_path).stdout
    assert said.startswith(
        f"the traces diverge at decision {found['index']} (run {found['run_id']},"
    )
    # The recording cut short has no more decisions; the full one goes on.
    assert found["expected"] is None
    actual = found["actual"]
    assert set(actual) == {"kind", "run_id", "what", "t", "line"}
    assert f"  a.jsonl: t={actual['t']:.3f}  {actual['kind']} {actual['run_id']}" in said
    assert json.loads(lines[actual["line"] - 1])["run_id"] == actual["run_id"]
    assert len(found["before"]) == 5
