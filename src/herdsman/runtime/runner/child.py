"""``Child``: a spawned child of a run and one epoll descriptor for all it does.

Every run's child has up to four descriptors the runner waits on: stdout
and stderr (readable), stdin while part of the prompt is left to write
(writable), and its exit (a pidfd, or a pipe a thread writes to where there
is none). They are all registered with one ``select.epoll`` of the run's
own, made by the spawn job in its worker thread; the event loop waits for
that single descriptor (``trio.lowlevel.wait_readable``) and, once woken,
handles whatever it says is ready with non-blocking reads and writes.

So a run costs the event loop one task and one wakeup per batch of events,
with no nursery, no task per stream, and no registration of each
descriptor with trio's own epoll (about four ``epoll_ctl`` per wait).
Inner registrations are level-triggered: a descriptor is unregistered as
soon as it has nothing more to say (EOF, the exit seen, the prompt
written), or the outer epoll would stay readable for ever.
"""

from __future__ import annotations

import os
import select
import subprocess
from collections.abc import Callable
from typing import Final

import trio

from herdsman.runtime.runner.output import Output

CHUNK: Final = 64 * 1024
"""The most bytes read from a pipe per wakeup (the size of a Linux pipe buffer)."""

_STDIN: Final = "stdin"
_EXIT: Final = "exit"


class Child:
    """A spawned child: its pid, its pipes and exit on one epoll, and its reaping.

    Made by :func:`herdsman.runtime.runner.spawn.spawn` in a worker thread.
    The child leads its own process group (a new session), so ``pid`` is
    also the group id. It is not reaped until :meth:`reap` finds it exited:
    an unreaped child keeps its pid, and so the group id, from being reused.
    """

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        exit_fd: int,
        stdin: tuple[int, memoryview] | None,
        stdout: int,
        stderr: int,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid
        #: Whether the child has exited (seen through its exit descriptor or
        #: by :meth:`reap`); it may not be reaped yet.
        self.exited = False
        #: The exit code once reaped (negative: killed by that signal).
        self.returncode: int | None = None
        #: What of the prompt is still to be written to stdin.
        self.prompt_rest = memoryview(b"")
        self._poller = select.epoll()  # close-on-exec, like every descriptor Python makes
        self._poller_fd = self._poller.fileno()
        self._roles: dict[int, str] = {}
        # Read only when epoll says so, yet a read must never block the event
        # loop. (stdin was made non-blocking by the spawn job; the exit
        # descriptor is never read.)
        os.set_blocking(stdout, False)
        os.set_blocking(stderr, False)
        self._add(stdout, "stdout", select.EPOLLIN)
        self._add(stderr, "stderr", select.EPOLLIN)
        self._add(exit_fd, _EXIT, select.EPOLLIN)
        if stdin is not None:
            self.prompt_rest = stdin[1]
            self._add(stdin[0], _STDIN, select.EPOLLOUT)

    def _add(self, fd: int, role: str, events: int) -> None:
        self._roles[fd] = role
        self._poller.register(fd, events)

    def _drop(self, fd: int) -> None:
        del self._roles[fd]
        # Unregistered before closing: a child forked by another thread may
        # hold a copy of the descriptor until it execs, and while a copy is
        # open, closing ours would leave it registered.
        self._poller.unregister(fd)
        os.close(fd)

    def _drop_role(self, role: str) -> None:
        for fd, held in list(self._roles.items()):
            if held == role:
                self._drop(fd)

    @property
    def feeding_stdin(self) -> bool:
        """Whether part of the prompt is still to be written."""
        return _STDIN in self._roles.values()

    def has_exited(self) -> bool:
        """Whether the child has exited (the ``until`` of a wait for its exit)."""
        return self.exited

    async def pump(self, output: Output, until: Callable[[], bool]) -> None:
        """Handle the child's output, stdin and exit as they come, until ``until()`` holds.

        Returns at once, without a checkpoint, if it holds already. Output
        goes to ``output``, streams at EOF are closed there, and ``exited``
        is set once the child has exited. Cancel the caller's scope to stop
        waiting.
        """
        while not until():
            await trio.lowlevel.wait_readable(self._poller_fd)
            self._handle_ready(output)

    def _handle_ready(self, output: Output) -> None:
        for fd, _ in self._poller.poll(0):
            role = self._roles.get(fd)
            if role is None:  # dropped by an earlier event of this batch
                continue
            if role == _EXIT:
                self._seen_exit()
            elif role == _STDIN:
                self._write_prompt(fd)
            else:
                try:
                    chunk = os.read(fd, CHUNK)
                except BlockingIOError:  # a spurious wakeup: nothing after all
                    continue
                if chunk:
                    output.feed(role, chunk)
                else:
                    self._drop(fd)
                    output.close_stream(role)

    def _seen_exit(self) -> None:
        self.exited = True
        self._drop_role(_EXIT)
        # The child will read no more of its prompt; a grandchild holding
        # stdin does not get the rest either.
        self._drop_role(_STDIN)

    def _write_prompt(self, fd: int) -> None:
        try:
            sent = os.write(fd, self.prompt_rest)
        except BlockingIOError:
            return
        except OSError:
            # The child closed stdin or exited before reading it all; its
            # exit status and output tell the story, not this.
            sent = len(self.prompt_rest)
        self.prompt_rest = self.prompt_rest[sent:]
        if not self.prompt_rest:
            self._drop(fd)

    def reap(self) -> int | None:
        """Reap the child if it has exited, without waiting; its exit code, or None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return None
            self.returncode = os.waitstatus_to_exitcode(status)
            # Popen must know too: one it believes unreaped is polled again
            # when it is collected, and by then the pid may be another child's.
            self._popen.returncode = self.returncode
            if not self.exited:
                self._seen_exit()
        return self.returncode

    def close(self) -> None:
        """Close the pipes, the exit descriptor and the epoll (the child should be reaped)."""
        for fd in list(self._roles):
            os.close(fd)
        self._roles.clear()
        self._poller.close()
