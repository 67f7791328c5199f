"""``execute``: run one agent process under its limits and say how it ended.

The life of a run:

1. The child is spawned with the spec's argv, cwd and complete environment,
   as the leader of a new session and so of its own process group; every
   process it starts stays in that group unless it moves itself out.
2. The prompt is written to its stdin and stdin is closed: right after the
   spawn, in the same worker-thread job, when the pipe takes it whole (the
   usual case), else as the pipe takes it, between reads of stdout and
   stderr, so a large prompt cannot deadlock against a child that writes
   before it has read everything.
3. One task does all the waiting, on one epoll descriptor of the run's own
   that holds stdout, stderr, stdin (while the prompt is unwritten) and the
   child's exit (child.py): one wakeup of the event loop handles whatever
   is ready, with no nursery, no task per stream and no registration of
   each descriptor with trio.
4. Every chunk read goes to the log file at once (nothing accumulates in
   memory), to the excerpt builder, and, split into lines, to the protocol
   adapter (output.py).
5. The wait for the exit is also the watchdog: it runs in a cancel scope
   whose deadline is the nearest limit, spawn time + ``timeout`` or last
   output + ``idle_timeout``. Output moves the latter, so when the scope
   runs out the limits are looked at again before the run is stopped.
6. The run ends when the child exits, a limit fires, ``RunCancel.cancel`` is
   called, or the caller's cancel scope is cancelled. In every case what is
   left of the process group is stopped (group.py), the child is reaped,
   the pipes are drained, and everything is closed in one place. At a
   normal end (both pipes at EOF, the child exited, its group empty) that
   takes no awaiting at all; otherwise the cleanup runs shielded, so it
   completes even while the caller is being cancelled, and then
   ``trio.Cancelled`` is re-raised.

When the child exits by itself while processes it started still hold stdout
or stderr open, the runner waits at most ``EXIT_EOF_GRACE`` seconds for the
pipes to close and then stops the rest of the group: a run's processes do not
outlive the run. Output a process already wrote is still read (the pipes are
drained for up to ``DRAIN_GRACE`` seconds after the group is stopped).
"""

from __future__ import annotations

import math
from typing import Final

import trio

from herdsman.runtime.runner.cancel import RunCancel
from herdsman.runtime.runner.child import Child
from herdsman.runtime.runner.excerpt import ExcerptBuilder
from herdsman.runtime.runner.group import stop_at_once, stop_group
from herdsman.runtime.runner.output import Output
from herdsman.runtime.runner.protocols import make_adapter
from herdsman.runtime.runner.protocols.base import ProtocolAdapter
from herdsman.runtime.runner.spawn import spawner
from herdsman.runtime.runner.spec import Outcome, ProcessOutcome, ProcessSpec, not_started

EXIT_EOF_GRACE: Final = 0.5
"""Seconds to wait for the pipes to close once the child has exited."""

DRAIN_GRACE: Final = 1.0
"""Seconds to keep reading the pipes after the group was stopped."""


def _human_seconds(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


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


def _nearest_limit(
    spec: ProcessSpec, output: Output, started_at: float
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


async def _watch(
    child: Child, spec: ProcessSpec, output: Output, started_at: float, stop: _Stop
) -> bool:
    """Handle the child's I/O until it exited (True), a limit passed or a stop came (False).

    The child is not reaped here: an unreaped child keeps its pid, and so
    the group id, from being reused, which makes the SIGTERM to the group
    that follows safe.
    """
    while True:
        deadline, limit = _nearest_limit(spec, output, started_at)
        if limit is not None and trio.current_time() >= deadline:
            stop.request(Outcome.TIMED_OUT, _limit_reason(spec, limit), limit)
            return False
        # One scope per run in the usual case; a new one only when the
        # deadline passed after output had moved the idle deadline on.
        with trio.CancelScope(deadline=deadline) as scope:
            stop.bind(scope)
            await child.pump(output, child.has_exited)
            stop.child_exited = True
            return True
        if stop.status is not None:
            return False


async def _finish(child: Child, spec: ProcessSpec, output: Output) -> None:
    """Stop what is left of the group, then drain the pipes (bounded)."""
    await stop_group(child, output, spec.kill_grace)
    # A process that left the group (setsid) may hold the pipes forever.
    with trio.move_on_after(DRAIN_GRACE):
        await child.pump(output, output.all_closed)


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
        output = Output(log, adapter, excerpt)
        # Not logged in for good: the agent would retry until a timeout.
        output.on_auth_failure = lambda words: stop.request(
            Outcome.FAILED, f"stopped early: the account is not logged in ({words})"
        )
        try:
            task_status.started(child.pid)
            exited = await _watch(child, spec, output, trio.current_time(), stop)
            if exited and not output.all_closed():
                with trio.move_on_after(EXIT_EOF_GRACE):
                    await child.pump(output, output.all_closed)
        finally:
            try:
                # The usual end needs no awaiting, and so no shield.
                if not (stop_at_once(child) and output.all_closed()):
                    output.keep_failures()  # raised below, once the group is stopped
                    with trio.CancelScope(shield=True):
                        await _finish(child, spec, output)
                output.finish()
            finally:
                child.close()
        if output.failure is not None:  # the log failed while the group was stopped
            raise output.failure
    exit_code = child.returncode
    assert exit_code is not None  # reaped by stop_at_once or _finish
    if stop.status is not None:
        reason = stop.reason
        if stop.status is Outcome.TIMED_OUT and adapter.last_problem is not None:
            # A limit is rarely the cause itself: an agent that cannot reach
            # its API retries until it fires, and says so on its way.
            reason = f"{reason}; {adapter.last_problem}"
        return ProcessOutcome(
            status=stop.status,
            exit_code=exit_code,
            reason=reason,
            limit=stop.limit,
            result=None,
            session_id=adapter.session_id,
            excerpt=excerpt.text(),
            usage_limit=adapter.usage_limit,
            usage=adapter.usage,
            worked=adapter.worked,
        )
    return ended_by_itself(adapter, exit_code, excerpt.text())


def ended_by_itself(adapter: ProtocolAdapter, exit_code: int, excerpt: str) -> ProcessOutcome:
    """The outcome of a process that exited by itself, as its protocol adapter read its output."""
    verdict = adapter.verdict(exit_code)
    return ProcessOutcome(
        status=verdict.status,
        exit_code=exit_code,
        reason=verdict.error,
        limit=None,
        result=verdict.result,
        session_id=verdict.session_id,
        excerpt=excerpt,
        usage_limit=verdict.usage_limit,
        usage=adapter.usage,
        worked=adapter.worked,
    )
