"""The shipped example, started as the README says: runs go, the user's clone is untouched."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from supervisor_support import Start, free_port, git_repository

from herdsman.config import load_config

EXAMPLE = Path(__file__).resolve().parents[3] / "supervisor.toml.example"


def git(clone: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(clone), *args], check=True, capture_output=True, text=True
    ).stdout


async def test_a_conversation_on_the_example_makes_no_worktree_or_branch_in_the_clone(
    start: Start, tmp_path: Path
) -> None:
    # A clone of the user's, with the example copied into it as the README does.
    clone = git_repository(tmp_path / "clone")
    shutil.copy(EXAMPLE, clone / "supervisor.toml")
    worktrees, branches = git(clone, "worktree", "list"), git(clone, "branch", "--list")
    config = load_config(
        clone / "supervisor.toml",
        [
            f'supervisor.state_dir="{tmp_path / "state"}"',
            f'api.listen="127.0.0.1:{free_port()}"',
            'providers.demo.exec=["herdsman-demo-agent", "--delay", "0"]',
        ],
        environ={},
    ).config
    running = await start(config)
    run = (
        await running.client.post(
            "/v1/runs", json={"provider": "demo", "prompt": "say hello", "conversation": "c-1"}
        )
    ).json()
    done = await running.wait(run["id"])
    assert done["status"] == "succeeded", done
    assert done["result"] == "demo reply: say hello\n"
    assert git(clone, "worktree", "list") == worktrees
    assert git(clone, "branch", "--list") == branches
    assert not (tmp_path / "state" / "worktrees").exists() or not any(
        (tmp_path / "state" / "worktrees").iterdir()
    )
