"""`herdsman` as a real process: run the CLI, start and stop a supervisor, find its agents."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CLI = ("-c", "supervisor.toml")


def processes_with_env(entry: str, under: Path) -> list[int]:
    """Pids of live processes whose environment contains ``entry`` (KEY=VALUE).

    Only those working in ``under`` (the test's own folder): other test
    sessions on the machine run agents with the same run ids.
    """
    root = str(under.resolve())
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if entry.encode() in environ and (cwd == root or cwd.startswith(root + "/")):
            found.append(int(pid))
    return found


def process_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def fence_keepers_of(pid: int) -> list[int]:
    """The fence keepers the process ``pid`` started (fence_keeper.py)."""
    found = []
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"herdsman.runtime.fence_keeper" in command:
            found.append(int(child))
    return found


def herdsman(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "herdsman", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class Supervisor:
    """A `herdsman run` child process and the ways to stop it."""

    def __init__(self, directory: Path, *, wait: bool = True) -> None:
        """Start it in ``directory``; with ``wait``, return once it is running."""
        self.directory = directory
        self.log = (directory / "supervisor.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "herdsman", "run", "-c", "supervisor.toml"],
            cwd=directory,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        if wait:
            self.wait_for("herdsman is running")

    def wait_for(self, line: str) -> None:
        """Wait until its log shows ``line`` (20 s at most); it must not exit meanwhile."""
        deadline = time.monotonic() + 20
        while line not in self.output():
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.05)

    def output(self) -> str:
        return (self.directory / "supervisor.log").read_text()

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30) -> int:
        self.process.send_signal(signum)
        return self.process.wait(timeout)

    def kill_with_its_keeper(self) -> None:
        """SIGKILL the supervisor and its fence keeper together (the OOM killer, say).

        The supervisor is stopped first, so that it sees nothing: no cleanup
        at all, and its agents live on in their own process groups.
        """
        [keeper] = fence_keepers_of(self.process.pid)
        self.process.send_signal(signal.SIGSTOP)
        os.kill(keeper, signal.SIGKILL)
        self.process.kill()
        self.process.wait()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()
