"""The issue's reproductions through the real API, real git and real agents: links under
the state directory are never followed (a swapped checkout, a planted conversation folder),
and a configuration path that is no regular file is refused on reload."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from supervisor_support import Running, Start, config_at, git_repository, write_config

from herdsman.runtime.main import StartFailed, run_supervisor
from herdsman.runtime.worktrees.slug import conversation_slug

LOOKING_AGENT = """\
import os, sys
sys.stdin.read()
print(os.environ.get("HERDSMAN_REPOS", "no HERDSMAN_REPOS"))
"""


async def run_to_end(running: Running, **body: Any) -> dict[str, Any]:
    body.setdefault("prompt", "hello")
    response = await running.client.post("/v1/runs", json=body)
    assert response.status_code == 201, response.text
    return await running.wait(response.json()["id"])


def setup(tmp_path: Path) -> tuple[Path, Path]:
    """A repository, and a configuration with its worktrees swept as soon as idle."""
    repo = git_repository(tmp_path / "repo")
    agent = tmp_path / "agent.py"
    agent.write_text(LOOKING_AGENT)
    provider = f'[providers.look]\nexec = ["{sys.executable}", "{agent}"]\nconcurrency = 1\n'
    extra = f'[[repos]]\nname = "app"\npath = "{repo}"\n[retention]\nidle = "0s"\n'
    return repo, write_config(tmp_path, extra_provider=provider, extra=extra)


async def test_the_sweep_refuses_a_checkout_swapped_for_the_users_worktree(
    start: Start, tmp_path: Path
) -> None:
    repo, config = setup(tmp_path)
    user = tmp_path / "userwt"
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "-q", "-b", "feature", str(user)],
        check=True,
        capture_output=True,
    )
    running = await start(config_at(config))
    done = await run_to_end(running, provider="look", conversation="conv1")
    assert done["status"] == "succeeded"
    checkout = Path(done["result"].strip()) / "app"
    # The agent's swap (it runs as the same user).
    subprocess.run(["rm", "-rf", str(checkout)], check=True)
    checkout.symlink_to(user)

    response = await running.client.post("/v1/worktrees/sweep", json={})

    entries = response.json()["entries"]
    assert [(e["path"], e["action"]) for e in entries] == [(str(checkout), "refused")]
    assert "is a symbolic link" in entries[0]["detail"]
    assert (user / "README.md").read_text() == "hello\n"
    listed = (await running.client.get("/v1/worktrees")).json()["worktrees"]
    assert [(w["path"], w["status"]) for w in listed] == [
        (str(checkout), "refused (a symbolic link)")
    ]


async def test_a_link_planted_at_a_conversations_folder_is_not_followed(
    start: Start, tmp_path: Path
) -> None:
    _, config = setup(tmp_path)
    running = await start(config_at(config))
    outside = tmp_path / "outside"
    outside.mkdir()
    worktrees = running.config.supervisor.state_dir / "worktrees"
    worktrees.mkdir(exist_ok=True)
    (worktrees / conversation_slug("default", "conv1")).symlink_to(outside)

    done = await run_to_end(running, provider="look", conversation="conv1")

    assert done["status"] == "succeeded"  # the run goes on, the repository read-only
    assert done["result"] == "no HERDSMAN_REPOS\n"
    [note] = done["notes"]
    assert "is a symbolic link" in note
    assert list(outside.iterdir()) == []
    assert (await running.client.get("/v1/worktrees")).json()["worktrees"] == []


async def test_a_reload_of_a_path_that_is_no_file_is_rejected_and_changes_nothing(
    start: Start, tmp_path: Path
) -> None:
    path = write_config(tmp_path, concurrency=1)
    running = await start(path)
    before = running.supervisor.config
    kept = tmp_path / "kept.toml"
    path.rename(kept)
    big = tmp_path / "big.toml"
    with big.open("wb") as file:
        file.truncate((1 << 20) + 1)  # 1 MiB, the documented limit, and a byte
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, what in (
        (Path("/dev/zero"), "a character device"),
        (fifo, "a named pipe (FIFO)"),
        (tmp_path, "a directory"),
        (big, "larger than 1 MiB"),
    ):
        path.unlink(missing_ok=True)
        path.symlink_to(target)
        response = await running.client.post("/v1/reload")
        assert response.status_code == 422, response.text
        [error] = response.json()["errors"]
        assert error.startswith(f"{path}: cannot read file: {what}"), error
        assert running.supervisor.config is before
    # Runs still flow under the configuration in force.
    assert (await run_to_end(running, provider="demo"))["status"] == "succeeded"


async def test_a_link_planted_at_a_runs_log_is_not_written_through(
    start: Start, tmp_path: Path
) -> None:
    running = await start(config_at(write_config(tmp_path)))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    logs = running.config.supervisor.state_dir / "logs"
    logs.mkdir(exist_ok=True)
    (logs / "r1.log").symlink_to(victim)
    done = await run_to_end(running, provider="demo", id="r1")
    assert done["status"] == "failed"
    assert "is a symbolic link" in done["reason"]
    assert victim.read_text() == "precious\n"
    # The next run's log is made as usual.
    assert (await run_to_end(running, provider="demo", id="r2"))["status"] == "succeeded"
    assert not (logs / "r2.log").is_symlink()


def test_a_link_planted_at_the_trace_folder_stops_the_start(tmp_path: Path) -> None:
    config = config_at(write_config(tmp_path))
    outside = tmp_path / "outside"
    outside.mkdir()
    state = config.supervisor.state_dir
    state.mkdir()
    (state / "traces").symlink_to(outside)
    with pytest.raises(StartFailed, match=r"traces is a symbolic link"):
        run_supervisor(config)
    assert list(outside.iterdir()) == []
