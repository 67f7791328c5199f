"""Spawning the child of a run: log, pipes, fork-exec, pidfd, prompt in one thread job.

Everything between a spec and a running child is blocking system calls:
creating the working directory and the log file (after logs are deleted in
bulk, creating a file can take the kernel milliseconds), three pipes,
fork-exec, ``pidfd_open``, writing the prompt and closing stdin.
:func:`spawn` makes them all in one worker thread, so a run costs the event
loop one thread hop. (Before, the log had a hop of its own and
``trio.lowlevel.open_process`` another for ``Popen``, with the pipes made
and the child's ends closed on the event loop, and it opened a pidfd of its
own next to the runner's.)

:class:`Child` (child.py) gets the parent's ends of the pipes and a
descriptor that becomes readable when the child exits (its pidfd; where
there is none, a pipe closed by a thread once ``waitid(WNOWAIT)`` returns),
all registered, here in the worker thread, with an epoll of the run's own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Final

import trio

from herdsman.runtime.runner.child import Child
from herdsman.runtime.runner.spec import ProcessSpec
from herdsman.runtime.state_paths import PRIVATE_DIR, open_below
from herdsman.runtime.thread_calls import ThreadCalls

SPAWN_THREADS: Final = 16
"""Spawns made at once in worker threads; more wait their turn (trio's default cap is 40)."""


def _open_log(path: str) -> BinaryIO:
    """Create (or truncate) the log file (``0600``), and its parent directories if needed.

    Neither the log nor its folder (``<state_dir>/logs``) is reached
    through a link: an agent's link there would have the run's output
    truncate and overwrite whatever it pointed at.
    """
    log = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    try:
        fd = open_below(log.parent.parent, log, flags)
    except (FileNotFoundError, NotADirectoryError):
        # A parent is missing, or is no directory: the walk makes the former
        # (0700) and raises the error that names the latter.
        fd = open_below(log.parent.parent, log, flags, make_dirs=True)
    return os.fdopen(fd, "wb")


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None where the platform or kernel has none."""
    if sys.platform != "linux":
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # a kernel older than 5.3, or a sandbox that forbids it
        return None


def _report_exit(pid: int, write_fd: int) -> None:
    """Block until ``pid`` has exited, leaving it unreaped, then close ``write_fd``."""
    with contextlib.suppress(ChildProcessError):  # reaped already: it has exited
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    # The reader sees EOF: the exit, as a pidfd would say it.
    os.close(write_fd)


def _exit_fd(pid: int) -> int:
    """A descriptor that becomes readable once ``pid`` has exited.

    A pidfd where there is one; else the read end of a pipe whose write end
    a thread of its own closes once ``waitid(WNOWAIT)`` sees the exit (a
    plain thread, not trio's: it needs no token of any limiter, and ends
    with the child, which the runner always stops).
    """
    pidfd = _pidfd(pid)
    if pidfd is not None:
        return pidfd
    read_fd, write_fd = os.pipe()
    try:
        threading.Thread(
            target=_report_exit, args=(pid, write_fd), name=f"herdsman-exit-{pid}", daemon=True
        ).start()
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    return read_fd


def _send_prompt(fd: int, prompt: bytes) -> memoryview:
    """Write what the pipe ``fd`` takes of ``prompt`` without waiting; the rest (empty if none).

    A prompt that fits in the pipe buffer (64 KiB on Linux) goes in one
    write. The parent's end is made non-blocking first, so this never waits
    for the child; whatever did not fit is left to the runner, which writes
    it as the pipe takes it, between reads of stdout and stderr.
    """
    os.set_blocking(fd, False)
    if prompt:
        try:
            sent = os.write(fd, prompt)
        except BlockingIOError:
            return memoryview(prompt)
        except OSError:
            pass  # the child closed stdin or exited already: its output tells
        else:
            return memoryview(prompt)[sent:]
    return memoryview(b"")


def spawn(job: tuple[ProcessSpec, Callable[[], bool]]) -> tuple[Child, BinaryIO]:
    """Make a spec's cwd (if asked), open its log, spawn its child: in a worker thread.

    ``job`` is the spec and a function that says whether the prompt is
    still wanted (False once the run was cancelled). The child runs
    ``spec.argv`` with the spec's environment and cwd, stdin, stdout and
    stderr on fresh pipes, in a new session; then its prompt is written to
    stdin (see :func:`_send_prompt`) and stdin closed if it took it all,
    or stdin is closed unwritten if the prompt is no longer wanted. Raises
    ``OSError`` when the log cannot be opened or the child not spawned,
    ``UnicodeEncodeError`` for a prompt that is no valid Unicode, before
    anything is spawned; nothing is left open then (an empty log file may be
    left). Should what the runner needs after the spawn fail (descriptors
    for the exit or the epoll), the child is killed and reaped and the
    error raised.
    """
    spec, prompt_wanted = job
    # Before the spawn: a prompt that cannot be encoded (a lone surrogate)
    # raises here, not once a child is running.
    prompt = spec.prompt.encode("utf-8")
    if spec.make_cwd:
        spec.cwd.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    log = _open_log(spec.log_file)
    # os.pipe's ends are close-on-exec: the child gets its ends only as its
    # stdin, stdout and stderr, and no other child (spawned by another
    # thread at the same time) gets any.
    with contextlib.ExitStack() as on_failure:
        on_failure.callback(log.close)
        stdin_read, stdin_write = os.pipe()
        on_failure.callback(os.close, stdin_write)
        with contextlib.ExitStack() as child_ends:
            child_ends.callback(os.close, stdin_read)
            stdout_read, stdout_write = os.pipe()
            on_failure.callback(os.close, stdout_read)
            child_ends.callback(os.close, stdout_write)
            stderr_read, stderr_write = os.pipe()
            on_failure.callback(os.close, stderr_read)
            child_ends.callback(os.close, stderr_write)
            popen = subprocess.Popen(
                list(spec.argv),
                stdin=stdin_read,
                stdout=stdout_write,
                stderr=stderr_write,
                env=spec.env,  # a read-only snapshot already
                cwd=spec.cwd,
                start_new_session=True,
            )
        # The child is running: should anything below fail (no descriptor
        # left for its exit or its epoll, no thread), it is killed and
        # reaped (before the pipes are closed: callbacks run LIFO), not
        # left without an owner.
        on_failure.callback(_kill_and_reap, popen)
        rest = _send_prompt(stdin_write, prompt if prompt_wanted() else b"")
        exit_fd = _exit_fd(popen.pid)
        on_failure.callback(os.close, exit_fd)
        child = Child(
            popen, exit_fd, (stdin_write, rest) if rest else None, stdout_read, stderr_read
        )
        on_failure.pop_all()
    if not rest:
        os.close(stdin_write)  # the whole prompt is in: the child sees EOF after it
    return child, log


def _kill_and_reap(popen: subprocess.Popen[bytes]) -> None:
    """Kill a child that cannot be handed to the runner, and its group; reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(popen.pid, signal.SIGKILL)  # unreaped: the group id is still its own
    popen.wait()


_Spawner = ThreadCalls[tuple[ProcessSpec, Callable[[], bool]], tuple[Child, BinaryIO]]
_SPAWNER: trio.lowlevel.RunVar[_Spawner] = trio.lowlevel.RunVar("herdsman_spawner")


def spawner() -> _Spawner:
    """The current trio run's worker threads for :func:`spawn`."""
    try:
        return _SPAWNER.get()
    except LookupError:
        calls = ThreadCalls(spawn, max_threads=SPAWN_THREADS, pool="spawn")
        _SPAWNER.set(calls)
        return calls
