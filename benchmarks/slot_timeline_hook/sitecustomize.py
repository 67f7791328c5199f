"""Debug-only: note when each run passes each step of its slot, in ``herdsman run``.

Loaded by ``benchmarks/slot_timeline.py`` through ``PYTHONPATH`` (Python
imports a ``sitecustomize`` module at start-up) and active only in a
process started as ``herdsman run`` with ``HERDSMAN_SLOT_TIMELINE`` set to
a file, where it writes the times (``time.perf_counter``, seconds) at exit.
It wraps private functions of the supervisor's services, the ledger and the
spawn job from outside, so production code carries no timing of its own:
when those functions change, this breaks loudly (an AttributeError at start-up).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

_OUT = os.environ.get("HERDSMAN_SLOT_TIMELINE")


def _install(out: str) -> None:  # noqa: PLR0915 - a wrapper a step, side by side
    from herdsman.runtime import ledger  # noqa: PLC0415 - only when asked
    from herdsman.runtime.runner import spawn  # noqa: PLC0415
    from herdsman.runtime.supervisor.dispatch import Dispatcher  # noqa: PLC0415
    from herdsman.runtime.supervisor.execution import Execution  # noqa: PLC0415

    now = time.perf_counter
    runs: dict[str, dict[str, float]] = {}
    starts: dict[int, list[str]] = {}  # id() of a start's queued call -> its runs
    batches: list[tuple[float, float, int]] = []
    starter, runner, led = Dispatcher, Execution, ledger.Ledger

    def note(run_id: str, step: str) -> None:
        runs.setdefault(run_id, {})[step] = now()

    queue_starts = starter._queue_starts

    def queued(self: Any) -> Any:
        got = queue_starts(self)
        if got is not None:
            starts[id(got.pending)] = [run.id for run in got.runs]
            for run in got.runs:
                note(run.id, "queued")
        return got

    commit = led._commit

    def committed(self: Any, batch: Any) -> Any:
        began = now()
        try:
            return commit(self, batch)
        finally:
            ended = now()
            batches.append((began, ended, len(batch)))
            for call in batch:
                for run_id in starts.get(id(call), ()):
                    runs[run_id].update(commit_began=began, commit_ended=ended)

    settle = led._settle

    def settled(self: Any, batch: Any, results: Any) -> Any:
        for call in batch:
            for run_id in starts.pop(id(call), ()):
                note(run_id, "settling")
        return settle(self, batch, results)

    started = starter._started

    def callback(self: Any, records: Any) -> Any:
        for record in records:
            note(record.id, "callback")
        return started(self, records)

    execute_run = runner.execute_run

    async def task(self: Any, record: Any, pick: Any, config: Any) -> Any:
        note(record.id, "task")
        return await execute_run(self, record, pick, config)

    spawn_job = spawn.spawn

    def spawned(job: Any) -> Any:
        run_id = job[0].env.get("HERDSMAN_RUN_ID", "?")
        note(run_id, "spawn_began")
        try:
            return spawn_job(job)
        finally:
            note(run_id, "spawn_ended")

    record_finish = runner._record_finish

    async def finish(self: Any, record: Any, ended: Any, *, may_start: bool) -> Any:
        note(record.id, "finish")  # the slot is freed here, the next start queued
        return await record_finish(self, record, ended, may_start=may_start)

    wraps: list[tuple[Any, str, Callable[..., Any]]] = [
        (starter, "_queue_starts", queued),
        (led, "_commit", committed),
        (led, "_settle", settled),
        (starter, "_started", callback),
        (runner, "execute_run", task),
        (spawn, "spawn", spawned),
        (runner, "_record_finish", finish),
    ]
    for owner, name, wrapper in wraps:
        setattr(owner, name, wrapper)

    def dump() -> None:
        with open(out, "w", encoding="utf-8") as file:
            json.dump({"runs": runs, "batches": batches}, file)

    atexit.register(dump)


if _OUT and sys.argv[1:2] == ["run"]:
    _install(_OUT)
