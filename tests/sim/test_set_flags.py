"""``--set`` on a trace's own configuration: a wrong one is named as the flag, not the trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_workloads import busy_trace, herdsman


def _commands(trace: Path) -> dict[str, list[str]]:
    """Each command that takes ``--set`` over the configuration in ``trace``'s header."""
    return {
        "replay": ["sim", "replay", str(trace), "--engine", "fast", "--out", "out.jsonl"],
        "generate": [
            "sim", "generate", "--arrivals", f"recorded:{trace}", "--durations",
            f"empirical:{trace}", "--span", "1h", "--out", "out.jsonl",
        ],
    }  # fmt: skip


@pytest.mark.parametrize("command", ["replay", "generate"])
@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["providers.claude.concurrency=0"],
            "--set providers.claude.concurrency=0: providers.claude.concurrency: must be a whole"
            " number from 1 to 64, got 0",
        ),
        (
            ["concurrency"],
            "--set concurrency: must be KEY=VALUE, e.g. providers.claude.concurrency=2",
        ),
        (
            ["supervisor.max_concurrency=2", "providers.claud.concurrency=2"],
            "--set supervisor.max_concurrency=2 --set providers.claud.concurrency=2:"
            " providers.claud: not in the configuration; did you mean 'claude'?",
        ),
    ],
)  # fmt: skip
def test_a_refused_set_names_the_flag_not_the_trace(
    tmp_path: Path, command: str, sets: list[str], message: str
) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=10)
    argv = _commands(trace)[command]
    done = herdsman(*argv, *(part for text in sets for part in ("--set", text)), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith(f"herdsman: {message}"), done.stderr
    assert len(done.stderr.splitlines()) == 1
    assert str(trace) not in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("command", ["replay", "generate"])
def test_a_header_refused_on_its_own_still_names_the_trace(tmp_path: Path, command: str) -> None:
    trace = busy_trace(tmp_path / "busy.jsonl", runs=10)
    lines = trace.read_text().splitlines()
    header = json.loads(lines[0])
    header["config"]["providers"]["codex"]["concurrency"] = 0
    trace.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    argv = _commands(trace)[command]
    done = herdsman(*argv, "--set", "supervisor.max_concurrency=2", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        f"herdsman: {trace}:1: config: providers.codex.concurrency: must be a whole number"
        " from 1 to 64, got 0\n"
    )
