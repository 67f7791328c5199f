"""``execute``: run one agent process under its limits and say how it ended.

The life of a run:

1. The child is spawned with the spec's argv, cwd and complete environment,
   as the leader of a new session and so of its own process group; every
   process it starts stays in that group unless it moves itself out.
2. The prompt is written to its stdin and stdin is closed: right after the
   spawn, in the same worker-thread job, when the pipe takes it whole (the
   usual case), else by a task of its own while stdout and stderr are read,
   so a large prompt cannot deadlock against a child that writes before it
   has read everything.
3. Every chunk read goes to the log file at once (nothing accumulates in
   memory), to the excerpt builder, and, split into lines, to the protocol
   adapter.
4. The task waiting for the child's exit is also the watchdog: it enforces
   ``timeout`` (from spawn) and ``idle_timeout`` (since the last byte on
   stdout or stderr).
5. The run ends when the child exits, a limit fires, ``RunCancel.cancel`` is
   called, or the caller's cancel scope is cancelled. In every case what is
   left of the process group is stopped (below), the child is reaped, and the
   pipes are drained; this cleanup runs shielded, so it completes even while
   the caller is being cancelled, and then ``trio.Cancelled`` is re-raised.

Stopping the group: SIGTERM to the whole group, then, after ``kill_grace``
seconds, SIGKILL to whatever is still alive. A group counts as empty when all
its members are zombies: an init that never reaps orphans (common in
containers) must not make every stop wait the full grace.

When the child exits by itself while processes it started still hold stdout
or stderr open, the runner waits at most ``EXIT_EOF_GRACE`` seconds for the
pipes to close and then stops the rest of the group: a run's processes do not
outlive the run. Output a process already wrote is still read (the pipes are
drained for up to ``DRAIN_GRACE`` seconds after the group is stopped).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import Iterator
from typing import BinaryIO, Final

import trio

from herdsman.runtime.runner.cancel import RunCancel
from herdsman.runtime.runner.excerpt import ExcerptBuilder
from herdsman.runtime.runner.protocols import ProtocolAdapter, make_adapter
from herdsman.runtime.runner.spawn import Child, spawner
from herdsman.runtime.runner.spec import Outcome, ProcessOutcome, ProcessSpec, not_started

EXIT_EOF_GRACE: Final = 0.5
"""Seconds to wait for the pipes to close once the child has exited."""

DRAIN_GRACE: Final = 1.0
"""Seconds to keep reading the pipes after the group was stopped."""

MAX_LINE: Final = 8 * 1024 * 1024
"""The longest stdout line handed to an adapter whole; longer ones arrive in pieces."""

_CHUNK: Final = 64 * 1024
_POLL: Final = 0.02  # how often a stopping group is checked for survivors


def _human_seconds(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


class _LineSplitter:
    """Cuts one stream into lines for an adapter, holding at most ``MAX_LINE`` bytes."""

    def __init__(self) -> None:
        self._partial = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            if self._partial:
                self._partial += data[start : newline + 1]
                lines.append(bytes(self._partial))
                self._partial.clear()
            else:
                lines.append(data[start : newline + 1])
            start = newline + 1
        self._partial += data[start:]
        while len(self._partial) >= MAX_LINE:
            lines.append(bytes(self._partial[:MAX_LINE]))
            del self._partial[:MAX_LINE]
        return lines

    def flush(self) -> bytes | None:
        if not self._partial:
            return None
        rest = bytes(self._partial)
        self._partial.clear()
        return rest


class _Output:
    """Where output goes: the log file, the excerpt and the adapter."""

    def __init__(self, log: BinaryIO, adapter: ProtocolAdapter, excerpt: ExcerptBuilder) -> None:
        self._log = log
        self._adapter = adapter
        self._excerpt = excerpt
        self._splitters = {"stdout": _LineSplitter(), "stderr": _LineSplitter()}
        self.open_streams = {"stdout", "stderr"}
        self.all_closed = trio.Event()
        self.last_activity = trio.current_time()

    def feed(self, stream: str, chunk: bytes) -> None:
        self.last_activity = trio.current_time()
        self._log.write(chunk)
        # Flushed per chunk so `tail -f` on the log shows the run live.
        self._log.flush()
        self._excerpt.feed(chunk, stream)
        for line in self._splitters[stream].feed(chunk):
            self._to_adapter(stream, line)

    def _to_adapter(self, stream: str, line: bytes) -> None:
        if stream == "stdout":
            self._adapter.feed_line(line)
        else:
            self._adapter.feed_stderr_line(line)

    def close_stream(self, stream: str) -> None:
        rest = self._splitters[stream].flush()
        if rest is not None:
            self._to_adapter(stream, rest)
        self.open_streams.discard(stream)
        if not self.open_streams:
            self.all_closed.set()

    def finish(self) -> None:
        """Hand the adapter the partial last lines of streams that never closed."""
        for stream in sorted(self.open_streams):
            rest = self._splitters[stream].flush()
            if rest is not None:
                self._to_adapter(stream, rest)


class _Stop:
    """The first request to stop the run early: a limit or a ``RunCancel``."""

    def __init__(self) -> None:
        self.status: Outcome | None = None
        self.limit: str | None = None
        self.reason: str | None = None
        self.child_exited = False
        self._scope: trio.CancelScope | None = None

    def request(self, status: Outcome, reason: str, limit: str | None = None) -> None:
        # Once the child exited by itself, its own verdict stands.
        if self.status is not None or self.child_exited:
            return
        self.status, self.reason, self.limit = status, reason, limit
        if self._scope is not None:
            self._scope.cancel()

    def cancelled(self, reason: str) -> None:
        # Verbatim: the status already says "cancelled"; the reason says why.
        self.request(Outcome.CANCELLED, reason)

    def bind(self, scope: trio.CancelScope) -> None:
        self._scope = scope
        if self.status is not None:
            scope.cancel()


async def _feed_stdin(stdin: trio.abc.SendStream, rest: memoryview) -> None:
    try:
        await stdin.send_all(rest)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        # The child closed stdin or exited before reading it all; its exit
        # status and output tell the story, not this.
        pass
    finally:
        await stdin.aclose()


async def _pump(stream: trio.abc.ReceiveStream, name: str, output: _Output) -> None:
    while chunk := await stream.receive_some(_CHUNK):
        output.feed(name, bytes(chunk))  # a no-op copy for bytes
    output.close_stream(name)


def _nearest_limit(
    spec: ProcessSpec, output: _Output, started_at: float
) -> tuple[float, str | None]:
    """The nearest deadline and the limit it enforces; ``inf`` and None without limits."""
    deadline, limit = math.inf, None
    if spec.timeout is not None:
        deadline, limit = started_at + spec.timeout, "timeout"
    if spec.idle_timeout is not None:
        idle_deadline = output.last_activity + spec.idle_timeout
        if idle_deadline <= deadline:  # on a tie, idle_timeout is the one reported
            deadline, limit = idle_deadline, "idle_timeout"
    return deadline, limit


def _limit_reason(spec: ProcessSpec, limit: str) -> str:
    if limit == "timeout":
        return f"wall-clock timeout of {_human_seconds(spec.timeout or 0)} exceeded"
    return f"no output for {_human_seconds(spec.idle_timeout or 0)} (idle_timeout)"


async def _wait_exited(
    child: Child, spec: ProcessSpec, output: _Output, started_at: float, stop: _Stop
) -> bool:
    """Wait until the child exited (True) or one of its limits passed (False).

    This is also the watchdog, so that a run needs no task for it: the wait
    is bounded by the nearest deadline, spawn time + ``timeout`` or last
    output + ``idle_timeout``. Output moves the latter, so when the wait runs
    out the deadlines are looked at again before the stop is requested.

    The child is not reaped here: an unreaped child keeps its pid, and so
    the group id, from being reused, which makes the SIGTERM to the group
    that follows safe.
    """
    while True:
        deadline, limit = _nearest_limit(spec, output, started_at)
        if limit is not None and trio.current_time() >= deadline:
            stop.request(Outcome.TIMED_OUT, _limit_reason(spec, limit), limit)
            return False
        with trio.move_on_at(deadline):
            await child.wait_exited()
            return True


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
        os.killpg(pgid, signum)


def _group_signalable(pgid: int) -> bool:
    """Whether any process, zombies included, is left in group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (zombies don't count)."""
    if not _group_signalable(pgid):
        return False
    # killpg also succeeds on a group of zombies nobody reaps; look closer.
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


async def _stop_group(child: Child, grace: float) -> None:
    """SIGTERM the child's group, SIGKILL it after ``grace`` if needed, reap the child."""
    pgid = child.pid  # the child leads its own group (start_new_session)
    _signal_group(pgid, signal.SIGTERM)
    if child.poll() is not None and not _group_signalable(pgid):
        return  # the child exited (now reaped) and left no one behind: the usual case
    with trio.move_on_after(grace):
        await child.wait()
        # The usual case, a group that died with its leader, needs one
        # syscall; only a group that seems alive is looked at closely (a scan
        # of /proc, in a worker thread).
        while _group_signalable(pgid) and await trio.to_thread.run_sync(_group_alive, pgid):
            await trio.sleep(_POLL)
        return
    _signal_group(pgid, signal.SIGKILL)
    await child.wait()


async def _finish(child: Child, spec: ProcessSpec, output: _Output) -> None:
    """Stop what is left of the group, drain the pipes (bounded), close everything."""
    if not output.open_streams:  # both pipes reached EOF: nothing to drain
        await _stop_group(child, spec.kill_grace)
    else:
        async with trio.open_nursery() as nursery:
            # The readers of the first phase were cancelled; reading goes on
            # here so output written while the group dies is still logged.
            if "stdout" in output.open_streams:
                nursery.start_soon(_pump, child.stdout, "stdout", output)
            if "stderr" in output.open_streams:
                nursery.start_soon(_pump, child.stderr, "stderr", output)
            await _stop_group(child, spec.kill_grace)
            # A process that left the group (setsid) may hold the pipes forever.
            with trio.move_on_after(DRAIN_GRACE):
                await output.all_closed.wait()
            nursery.cancel_scope.cancel()
    output.finish()
    child.close()


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


@contextlib.contextmanager
def _internal_nursery_errors() -> Iterator[None]:
    """Let errors out of execute's own nursery the way callers expect them.

    The nursery is an implementation detail: a caller being cancelled should
    see ``trio.Cancelled``, and one failure (say, the disk filling under the
    log) should be that exception, not a group of it and the Cancelled its
    sibling tasks got.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = list(_leaves(group))
        real = [exc for exc in leaves if not isinstance(exc, trio.Cancelled)]
        if len(real) == 1:
            raise real[0] from group
        if not real:
            raise leaves[0] from None
        raise


async def execute(
    spec: ProcessSpec,
    *,
    cancel: RunCancel | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> ProcessOutcome:
    """Run ``spec`` to the end and return how it ended.

    Reports the child's pid through ``task_status`` once it is spawned. If
    ``cancel`` was cancelled before the process could be spawned, returns a
    ``cancelled`` outcome without spawning (and without calling
    ``task_status.started``). A failure to spawn (missing program, bad cwd, log
    file not writable) raises ``OSError``. If the caller's cancel scope is
    cancelled, the process group is stopped and reaped, then
    ``trio.Cancelled`` propagates.
    """
    stop = _Stop()
    if cancel is not None:
        cancel._attach(stop.cancelled)
        if cancel.reason is not None:
            stop.cancelled(cancel.reason)
    try:
        if stop.status is not None:
            return not_started(Outcome.CANCELLED, stop.reason)
        return await _run(spec, stop, task_status)
    finally:
        if cancel is not None:
            cancel._detach()


async def _run(spec: ProcessSpec, stop: _Stop, task_status: trio.TaskStatus[int]) -> ProcessOutcome:
    adapter = make_adapter(spec.protocol, usage_limit_pattern=spec.usage_limit_pattern)
    excerpt = ExcerptBuilder()
    # One worker-thread job makes the cwd, the log and the child (spawn.py
    # says why off the event loop). It is not abandoned when the caller is
    # cancelled: the child it spawns is always returned, and stopped below.
    # The prompt is written there too, unless a cancel came first.
    child, log = await spawner().call((spec, lambda: stop.status is None))
    # Nothing may checkpoint between the spawn and this try: a cancel
    # landing there would leave the group running.
    with log:
        output = _Output(log, adapter, excerpt)
        try:
            task_status.started(child.pid)
            started_at = trio.current_time()
            with _internal_nursery_errors(), trio.CancelScope() as run_scope:
                stop.bind(run_scope)
                async with trio.open_nursery() as nursery:
                    if child.stdin is not None:  # the prompt did not fit in the pipe
                        nursery.start_soon(_feed_stdin, child.stdin, child.prompt_rest)
                    nursery.start_soon(_pump, child.stdout, "stdout", output)
                    nursery.start_soon(_pump, child.stderr, "stderr", output)
                    if await _wait_exited(child, spec, output, started_at, stop):
                        stop.child_exited = True
                        if output.open_streams:
                            with trio.move_on_after(EXIT_EOF_GRACE):
                                await output.all_closed.wait()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await _finish(child, spec, output)
    exit_code = child.returncode
    assert exit_code is not None  # reaped by _finish
    if stop.status is not None:
        return ProcessOutcome(
            status=stop.status,
            exit_code=exit_code,
            reason=stop.reason,
            limit=stop.limit,
            result=None,
            session_id=adapter.session_id,
            excerpt=excerpt.text(),
            usage_limit=adapter.usage_limit,
        )
    verdict = adapter.verdict(exit_code)
    return ProcessOutcome(
        status=verdict.status,
        exit_code=exit_code,
        reason=verdict.error,
        limit=None,
        result=verdict.result,
        session_id=verdict.session_id,
        excerpt=excerpt.text(),
        usage_limit=verdict.usage_limit,
    )
