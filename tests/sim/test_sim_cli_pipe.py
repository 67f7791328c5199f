"""`herdsman sim ... | head`: a reader that goes away ends the command quietly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SIM = Path(__file__).parents[2] / "sim"


def test_a_closed_pipe_is_no_error_message(tmp_path: Path) -> None:
    # The diff of a trace against another says several lines; nobody reads them.
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "herdsman",
            "sim",
            "diff",
            str(SIM / "stop-restarted.jsonl"),
            str(SIM / "stop-forced.jsonl"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    child.stdout.close()  # before the child has written anything: it starts slowly
    _, err = child.communicate(timeout=60)
    assert "Broken pipe" not in err, err
    assert err == ""
