"""Finding and stopping agents that outlived their supervisor, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from herdsman.runtime.orphans import find_orphans, stop_groups


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A sleeping 'agent' with a child, in its own session, as the runner starts them."""
    env = {
        **os.environ,
        "HERDSMAN_RUN_ID": "run-1",
        "HERDSMAN_STATE_DIR": str(tmp_path / "state"),
    }
    script = (
        "import subprocess, sys, time;"
        " subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        " time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    time.sleep(0.3)  # let it start its child
    yield process
    if process.poll() is None:
        os.killpg(process.pid, 9)
    process.wait()


def test_orphans_are_found_by_run_id_and_state_dir(
    agent: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    assert find_orphans(["run-1", "run-2"], tmp_path / "state") == {"run-1": {agent.pid}}
    assert find_orphans(["run-1"], tmp_path / "another-state") == {}
    assert find_orphans(["run-2"], tmp_path / "state") == {}


async def test_stopping_an_orphan_stops_its_whole_process_group(
    agent: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    [group] = find_orphans(["run-1"], tmp_path / "state")["run-1"]
    await stop_groups({group}, grace=5)
    assert agent.wait(timeout=5) is not None
    time.sleep(0.2)
    # The grandchild was in the group too: nothing of run-1 is left.
    assert find_orphans(["run-1"], tmp_path / "state") == {}
