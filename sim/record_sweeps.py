"""Record sim/sweeps-recorded.jsonl: a real supervisor sweeping its conversations' worktrees.

`herdsman run` as a real process (as sim/record_stops.py runs it) with a
real git repository under ``[[repos]]``, worktrees kept no time once idle
(``idle = "0s"``) and swept every second: the demo agent in conversations
c0, c1 and c2, and a stand-in agent (a shell line) that leaves a file in
d0's checkout.

1. c0, c1 and d0 run; the sweeps then remove c0's and c1's clean
   worktrees and keep d0's dirty one, every time.
2. c0's removal is held open (a ``git`` on the supervisor's PATH that runs
   the real one, and waits before a removal under c0's folder until told):
   meanwhile a submit to c0 waits for it (the trace says ``removal_wait``),
   a submit to c0 with ``on_busy = "skip"`` is skipped (c0 counts as busy),
   and one to c2 runs. Then the removal goes on, and the waiting run is
   recorded and starts, making c0's worktree again.
3. c1 (swept) and d0 (kept dirty) run again; SIGTERM drains.

Machine-specific paths are replaced by ``/demo``, so the file is the same
wherever it is recorded (but for the run ids and times).

    .venv/bin/python sim/record_sweeps.py      # then: python sim/regenerate.py
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from record_stops import Life, free_port, init_repository

from herdsman.runtime.worktrees.slug import conversation_slug

HERE = Path(__file__).parent
NAME = "sweeps-recorded"

#: The stand-in agent: reads its prompt, leaves an untracked file in its checkout.
DIRTY = 'cat > /dev/null; echo notes > "$HERDSMAN_REPOS/repo/notes.txt"'

# Real git; a removal of a worktree under the folder named in ``hold``
# says so (``held``) and waits for ``go`` first (a minute at most).
SHIM = """\
#!/bin/sh
last=""
for arg; do last=$arg; done
hold=$(cat "{folder}/hold" 2>/dev/null)
case " $* " in
  *" worktree remove "*)
    case "$last" in
      */"$hold"/*)
        if [ -n "$hold" ]; then
          : > "{folder}/held"
          n=0
          while [ ! -e "{folder}/go" ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n + 1)); done
        fi ;;
    esac ;;
esac
exec "{git}" "$@"
"""


def config_text(port: int) -> str:
    demo = f'["{sys.executable}", "-m", "herdsman.demo_agent", "--delay", "0.5"]'
    return f"""\
[supervisor]
state_dir = "state"
parallel_preamble = false

[providers.demo]
exec = {demo}
concurrency = 2

[providers.dirty]
exec = ["sh", "-c", '{DIRTY}']
concurrency = 1

[[repos]]
name = "repo"
path = "repo"

[retention]
idle = "0s"
sweep_interval = "1s"

[api]
listen = "127.0.0.1:{port}"
"""


def worktree(folder: Path, conversation: str) -> Path:
    """Where the supervisor checks the repository out for ``conversation``."""
    return folder / "state" / "worktrees" / conversation_slug("default", conversation) / "repo"


def wait_for(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def traced(folder: Path, text: str) -> bool:
    """Whether the trace being written holds ``text`` yet."""
    return any(text in path.read_text() for path in (folder / "state" / "traces").glob("*.jsonl"))


def submit_aside(life: Life, answers: list[str], provider: str, conversation: str) -> None:
    """``life.submit`` on a connection of its own (it runs in a thread of its own)."""
    with httpx.Client(
        base_url=life.client.base_url, headers=life.client.headers, timeout=60
    ) as client:
        body = {"provider": provider, "prompt": "go", "conversation": conversation}
        response = client.post("/v1/runs", json=body)
        assert response.status_code in (200, 201), response.text
        answers.append(response.json()["id"])


def record(folder: Path) -> None:
    """Record the trace in ``folder``/state/traces (see the module docstring)."""
    init_repository(folder / "repo")
    real_git = shutil.which("git")
    assert real_git is not None, "git is not on PATH"
    shim = folder / "bin" / "git"
    shim.parent.mkdir()
    shim.write_text(SHIM.format(folder=folder, git=real_git))
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    port = free_port()
    (folder / "supervisor.toml").write_text(config_text(port))
    (folder / "hold").write_text(conversation_slug("default", "c0"))

    life = Life(folder, port, env)
    first = [life.submit("demo", "c0"), life.submit("demo", "c1"), life.submit("dirty", "d0")]
    for run_id in first:
        life.until(run_id, "succeeded")
    wait_for("a sweep removing c0's worktree", (folder / "held").exists)
    (folder / "hold").unlink()  # the next removals go on at once

    # A submit to c0 now waits for the removal: its answer comes after it.
    answers: list[str] = []
    waiting = threading.Thread(target=submit_aside, args=(life, answers, "demo", "c0"), daemon=True)
    waiting.start()
    wait_for("the submit to wait", lambda: traced(folder, '"event":"removal_wait"'))
    life.submit("demo", "c0", on_busy="skip")  # skipped: c0 counts as busy
    other = life.submit("demo", "c2")  # another conversation goes on meanwhile
    wait_for("c2 to start", lambda: traced(folder, f'"event":"start","run_id":"{other}"'))
    (folder / "go").touch()
    waiting.join(60)
    [again] = answers
    life.until(again, "succeeded")
    assert worktree(folder, "c0").exists(), "c0's run did not make its worktree again"

    wait_for("a sweep removing c1's worktree", lambda: not worktree(folder, "c1").exists())
    last = [life.submit("demo", "c1"), life.submit("dirty", "d0")]
    for run_id in (other, *last):
        life.until(run_id, "succeeded")
    assert worktree(folder, "c1").exists(), "c1's run did not make its worktree again"
    assert (worktree(folder, "d0") / "notes.txt").exists(), "d0's dirty worktree was removed"
    life.stop(signal.SIGTERM)


def main() -> None:
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name).resolve()
        try:
            record(folder)
        except BaseException:
            print((folder / "supervisor.log").read_text(), file=sys.stderr)
            raise
        [trace] = (folder / "state" / "traces").glob("*.jsonl")
        text = trace.read_text(encoding="utf-8")
    text = text.replace(str(folder), "/demo").replace(sys.executable, "python3")
    (HERE / f"{NAME}.jsonl").write_text(text, encoding="utf-8")
    print(f"wrote sim/{NAME}.jsonl")


if __name__ == "__main__":
    main()
