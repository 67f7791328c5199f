"""``herdsman logs``: a run's recorded stream as readable text, or as recorded with --raw."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "agent_streams"


def logs(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    config = tmp_path / "supervisor.toml"
    config.write_text(
        f'[supervisor]\nstate_dir = "{tmp_path / "state"}"\n\n'
        '[providers.claude]\nexec = ["claude", "-p"]\nprotocol = "claude"\n'
    )
    return subprocess.run(
        [sys.executable, "-m", "herdsman", "logs", "-c", str(config), *args],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8"},
        capture_output=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize("name", ["claude-tools", "codex-session"])
def test_logs_renders_an_agent_stream_and_raw_prints_it_as_recorded(
    tmp_path: Path, name: str
) -> None:
    recorded = (STREAMS / f"{name}.stdout").read_bytes()
    log = tmp_path / "state" / "logs" / "run-1.log"
    log.parent.mkdir(parents=True)
    log.write_bytes(recorded)
    shown = logs(tmp_path, "run-1")
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    assert "{" not in text.splitlines()[0]  # no JSON: text
    if name == "claude-tools":
        assert "→ Bash: pytest -x -q tests/test_parse.py" in text
        assert text.endswith(
            "result: success · 3 turns · 12.3s · $0.0421\n"
            "tokens: 30 input · 85 output · API 11.0s\n"
        )
    else:
        assert "$ bash -lc 'pytest -x -q'  (exit 1)" in text
        assert text.endswith("turn completed · input tokens 1200, cached 200, output tokens 345\n")
    raw = logs(tmp_path, "run-1", "--raw")
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout == recorded


def test_logs_of_a_run_that_never_started_says_so(tmp_path: Path) -> None:
    shown = logs(tmp_path, "run-2")
    assert shown.returncode == 1
    assert shown.stdout == b""
    assert b"no log at " in shown.stderr
    assert b"no run with this id has started" in shown.stderr


@pytest.mark.parametrize("run_id", ["../x", "a/b", ""])
def test_a_malformed_run_id_is_a_usage_error(tmp_path: Path, run_id: str) -> None:
    shown = logs(tmp_path, run_id)
    assert shown.returncode == 2, shown.stderr
    assert shown.stderr.decode().count("\n") == 1
    assert b"run id" in shown.stderr
    assert b"Traceback" not in shown.stderr
