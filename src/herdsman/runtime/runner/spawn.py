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

:class:`Child` is the little of ``trio.Process`` the runner uses: the pid,
the parent's ends of the pipes as ``FdStream``, waiting for the exit without
reaping (through the pidfd; where there is none, ``waitid(WNOWAIT)`` in a
worker thread), and reaping.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Final

import trio

from herdsman.runtime.runner.spec import ProcessSpec
from herdsman.runtime.thread_calls import ThreadCalls

_WAITID_LIMITER: Final = trio.CapacityLimiter(math.inf)
"""Exit waits without a pidfd: a thread per running child, unbounded, as in ``trio.Process``.

Never trio's default limiter: 40 long runs would hold all its tokens, and
the exit of a 41st, like every other worker-thread call, would wait.
"""

SPAWN_THREADS: Final = 16
"""Spawns made at once in worker threads; more wait their turn (trio's default cap is 40)."""


def _open_log(path: Path) -> BinaryIO:
    """Create (or truncate) the log file, and its parent directories if needed."""
    try:
        return open(path, "wb")
    except (FileNotFoundError, NotADirectoryError):
        # A parent is missing, or is no directory: mkdir creates the former
        # and raises the error that names the latter.
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "wb")


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None where the platform or kernel has none."""
    if sys.platform != "linux":
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # a kernel older than 5.3, or a sandbox that forbids it
        return None


def _wait_exited_blocking(pid: int) -> None:
    """Block until ``pid`` has exited, leaving it unreaped (its pid stays taken)."""
    with contextlib.suppress(ChildProcessError):  # reaped already: it has exited
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


class Child:
    """A spawned child: its pid, the parent's ends of its pipes, and its exit.

    Made by :func:`spawn`. The child leads its own process group (a new
    session), so ``pid`` is also the group id. It is not reaped until
    :meth:`poll` or :meth:`wait` reaps it: an unreaped child keeps its pid,
    and so the group id, from being reused.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        pidfd: int | None,
        stdin: tuple[int, memoryview] | None,
        stdout: int,
        stderr: int,
    ) -> None:
        self._popen = popen
        self._pidfd = pidfd
        self.pid = popen.pid
        # FdStream makes the parent's ends non-blocking; the child's ends,
        # separate open files, stay blocking as programs expect.
        #: The pipe to the child's stdin while part of the prompt is still to
        #: be written (``prompt_rest``); None once it was written and closed.
        self.stdin: trio.lowlevel.FdStream | None = None
        self.prompt_rest = memoryview(b"")
        if stdin is not None:
            self.stdin = trio.lowlevel.FdStream(stdin[0])
            self.prompt_rest = stdin[1]
        self.stdout = trio.lowlevel.FdStream(stdout)
        self.stderr = trio.lowlevel.FdStream(stderr)

    @property
    def returncode(self) -> int | None:
        """The exit code once the child was reaped (negative: killed by that signal)."""
        return self._popen.returncode

    def poll(self) -> int | None:
        """Reap the child if it has exited, without waiting; its exit code, or None."""
        return self._popen.poll()

    async def wait_exited(self) -> None:
        """Wait until the child has exited, without reaping it."""
        if self._popen.returncode is not None:
            await trio.lowlevel.checkpoint()
        elif self._pidfd is not None:
            await trio.lowlevel.wait_readable(self._pidfd)
        else:
            # Abandoned on cancel, the thread ends when the child does; the
            # runner stops the group right after any cancel.
            await trio.to_thread.run_sync(
                _wait_exited_blocking, self.pid, abandon_on_cancel=True, limiter=_WAITID_LIMITER
            )

    async def wait(self) -> int:
        """Wait until the child has exited, reap it, and return its exit code."""
        await self.wait_exited()
        return self._popen.wait()  # a zombie by now: waitpid returns at once

    def close(self) -> None:
        """Close the pipes and the pidfd (the child should be reaped by now)."""
        if self.stdin is not None:
            self.stdin.close()  # aclose() without its checkpoint; closing twice is a no-op
        self.stdout.close()
        self.stderr.close()
        if self._pidfd is not None:
            trio.lowlevel.notify_closing(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None


def _send_prompt(fd: int, prompt: bytes) -> memoryview | None:
    """Write what the pipe ``fd`` takes of ``prompt`` without waiting; the rest, if any.

    A prompt that fits in the pipe buffer (64 KiB on Linux) goes in one
    write, and ``fd`` is closed here. The parent's end is made non-blocking
    first, so this never waits for the child; whatever did not fit is left
    to the runner, which writes it next to the readers of stdout and stderr.
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
            if sent < len(prompt):
                return memoryview(prompt)[sent:]
    os.close(fd)
    return None


def spawn(job: tuple[ProcessSpec, Callable[[], bool]]) -> tuple[Child, BinaryIO]:
    """Make a spec's cwd (if asked), open its log, spawn its child: in a worker thread.

    ``job`` is the spec and a function that says whether the prompt is
    still wanted (False once the run was cancelled). The child runs
    ``spec.argv`` with the spec's environment and cwd, stdin, stdout and
    stderr on fresh pipes, in a new session; then its prompt is written to
    stdin (see :func:`_send_prompt`), or stdin is closed unwritten if the
    prompt is no longer wanted. Raises ``OSError`` when the log cannot be
    opened or the child not spawned, ``UnicodeEncodeError`` for a prompt
    that is no valid Unicode, before anything is spawned; nothing is left
    open then (an empty log file may be left).
    """
    spec, prompt_wanted = job
    # Before the spawn: a prompt that cannot be encoded (a lone surrogate)
    # raises here, not once a child is running.
    prompt = spec.prompt.encode("utf-8")
    if spec.make_cwd:
        spec.cwd.mkdir(parents=True, exist_ok=True)
    log = _open_log(spec.log_path)
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
        # The child is running: from here on nothing may fail and leave it
        # without an owner.
        on_failure.pop_all()
    rest = _send_prompt(stdin_write, prompt if prompt_wanted() else b"")
    stdin = None if rest is None else (stdin_write, rest)
    return Child(popen, _pidfd(popen.pid), stdin, stdout_read, stderr_read), log


_Spawner = ThreadCalls[tuple[ProcessSpec, Callable[[], bool]], tuple[Child, BinaryIO]]
_SPAWNER: trio.lowlevel.RunVar[_Spawner] = trio.lowlevel.RunVar("herdsman_spawner")


def spawner() -> _Spawner:
    """The current trio run's worker threads for :func:`spawn`."""
    try:
        return _SPAWNER.get()
    except LookupError:
        calls = ThreadCalls(spawn, max_threads=SPAWN_THREADS)
        _SPAWNER.set(calls)
        return calls
