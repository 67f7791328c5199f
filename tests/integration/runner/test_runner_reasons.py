"""A run's one-line reason names the real cause: the recorded streams, through real processes.

Each case replays a stream from tests/fixtures/agent_streams (recorded from
the real CLIs where its README says so) from a real child process: stdout,
then stderr, then the exit code the CLI gave.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runner_helpers import STREAMS, make_spec, replay

from herdsman.runtime.runner import execute
from herdsman.runtime.runner.spec import Outcome


@pytest.mark.parametrize(
    ("name", "protocol", "exit_code", "reason"),
    [
        (
            "claude-not-logged-in",
            "claude",
            1,
            "claude reported an error (authentication_failed): Not logged in · Please run /login",
        ),
        (
            "codex-untrusted-dir",
            "codex",
            1,
            "codex: Not inside a trusted directory and --skip-git-repo-check was not specified."
            " (no turn.completed event; exited with code 1)",
        ),
    ],
)
async def test_a_recorded_failure_reads_as_its_cause(
    tmp_path: Path, name: str, protocol: str, exit_code: int, reason: str
) -> None:
    spec = make_spec(tmp_path, argv=replay(name, exit_code), protocol=protocol)
    outcome = await execute(spec)
    assert outcome.status is Outcome.FAILED
    assert outcome.reason == reason
    # The log keeps the stream as it came.
    recorded = STREAMS / f"{name}.stdout", STREAMS / f"{name}.stderr"
    assert spec.log_path.read_bytes() == b"".join(p.read_bytes() for p in recorded if p.exists())


async def test_a_run_stopped_by_its_limit_says_what_the_agent_last_reported(
    tmp_path: Path,
) -> None:
    # Codex without network retries for ever: the timeout stops it, and the
    # reason carries the error it kept reporting.
    argv = replay("codex-no-network", 0, then_sleep=30)
    outcome = await execute(make_spec(tmp_path, argv=argv, protocol="codex", timeout=0.5))
    assert outcome.status is Outcome.TIMED_OUT
    assert outcome.reason == (
        "wall-clock timeout of 0.5s exceeded; last error: Reconnecting... waiting for network"
        " (Connection failed: error sending request)"
    )
