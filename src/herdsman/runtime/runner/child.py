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

Inner registrations are one-shot: a descriptor reports once and is then
disarmed until re-armed, which happens only when there may be more to
come (a chunk read, part of the prompt written). So a descriptor that has
said all it will (EOF, the exit) costs no system call to silence, and
closing the epoll before the descriptors, at the end, leaves nothing
registered that a copy of a descriptor (in a child another thread forked
and has not yet exec'd) could keep alive. The one descriptor ever closed
while armed, stdin at the exit, is unregistered first for that reason.

Why not trio's own process API (``trio.lowlevel.open_process`` and a
reader task per stream, as this runner was until 2026-11-30): with it, the
whole supervisor reached 32% of raw ``trio.run_process``'s rate with
batched submits (median of three passes, load 1.4-3.9), with this runner
50%, above the 40% herdsman holds itself to; the runner alone's event loop
per run went from 0.39-0.50 ms to 0.29-0.30 ms, below raw
``trio.run_process``'s own (docs/performance.md, "one epoll per run").
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

_READ: Final = select.EPOLLIN | select.EPOLLONESHOT
_WRITE: Final = select.EPOLLOUT | select.EPOLLONESHOT
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
        #: Armed descriptors, or to be re-armed, and what each is.
        self._roles: dict[int, str] = {}
        #: Descriptors still open; closed by close(), except stdin.
        self._open: list[int] = [stdout, stderr, exit_fd]
        # Read only when epoll says so, yet a read must never block the event
        # loop. (stdin was made non-blocking by the spawn job; the exit
        # descriptor is never read.)
        try:
            os.set_blocking(stdout, False)
            os.set_blocking(stderr, False)
            self._add(stdout, "stdout", _READ)
            self._add(stderr, "stderr", _READ)
            self._add(exit_fd, _EXIT, _READ)
            if stdin is not None:
                self.prompt_rest = stdin[1]
                self._open.append(stdin[0])
                self._add(stdin[0], _STDIN, _WRITE)
        except BaseException:
            self._poller.close()  # the rest belongs to the caller until this returns
            raise

    def _add(self, fd: int, role: str, events: int) -> None:
        self._roles[fd] = role
        self._poller.register(fd, events)

    def _close_stdin(self, fd: int, *, armed: bool) -> None:
        # Closed at once, not by close(): the child sees EOF on stdin.
        del self._roles[fd]
        self._open.remove(fd)
        if armed:
            self._poller.unregister(fd)
        os.close(fd)

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
        # Each reported descriptor is disarmed now (one-shot): an event left
        # unhandled would not come again, so a failing one (the log's disk
        # full) must not keep the others of its batch from being handled.
        failure: Exception | None = None
        for fd, _ in self._poller.poll(0):
            role = self._roles.get(fd)
            if role is None:  # the exit, reported after reap() had seen it
                continue
            try:
                self._handle(fd, role, output)
            except Exception as error:  # re-raised below, after the batch
                failure = failure or error
        if failure is not None:
            raise failure

    def _handle(self, fd: int, role: str, output: Output) -> None:
        if role == _EXIT:
            self._seen_exit()
        elif role == _STDIN:
            self._write_prompt(fd)
        else:
            try:
                chunk = os.read(fd, CHUNK)
            except BlockingIOError:  # a spurious wakeup: nothing after all
                self._poller.modify(fd, _READ)
                return
            if chunk:
                self._poller.modify(fd, _READ)  # first: armed again even if the output fails
                output.feed(role, chunk)
            else:
                del self._roles[fd]
                output.close_stream(role)

    def _seen_exit(self) -> None:
        self.exited = True
        for fd, role in list(self._roles.items()):
            if role == _EXIT:
                del self._roles[fd]  # one-shot: it reported, or will to no one
            elif role == _STDIN:
                # The child will read no more of its prompt; a grandchild
                # holding stdin does not get the rest either.
                self._close_stdin(fd, armed=True)

    def _write_prompt(self, fd: int) -> None:
        try:
            sent = os.write(fd, self.prompt_rest)
        except BlockingIOError:
            sent = 0
        except OSError:
            # The child closed stdin or exited before reading it all; its
            # exit status and output tell the story, not this.
            sent = len(self.prompt_rest)
        self.prompt_rest = self.prompt_rest[sent:]
        if self.prompt_rest:
            self._poller.modify(fd, _WRITE)
        else:
            self._close_stdin(fd, armed=False)

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
        """Close the epoll, then the pipes and the exit descriptor (the child should be reaped)."""
        self._poller.close()
        for fd in self._open:
            os.close(fd)
        self._open.clear()
        self._roles.clear()
