"""The prompt on stdin: written at once when the pipe takes it, else fed next to the readers."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest
import trio
from runner_helpers import make_spec, run_into, script

from herdsman.runtime.runner import ProcessOutcome, RunCancel, execute
from herdsman.runtime.runner.spec import Outcome

PIPE_BUFFER = 64 * 1024  # Linux's default pipe capacity

# Reads all of stdin (after an optional pause) and prints its length and hash.
READER = (
    "import hashlib, sys, time\n"
    "time.sleep(float(sys.argv[1]))\n"
    "data = sys.stdin.buffer.read()\n"
    "print(len(data), hashlib.sha256(data).hexdigest())\n"
)


def _digest(prompt: str) -> str:
    data = prompt.encode()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}\n"


@pytest.mark.parametrize(
    "size",
    [0, 1, PIPE_BUFFER - 1, PIPE_BUFFER, PIPE_BUFFER + 1, 5 * PIPE_BUFFER + 7],
)
@pytest.mark.parametrize("pause", [0.0, 0.3])
async def test_prompts_around_the_pipe_buffer_arrive_byte_for_byte(
    tmp_path: Path, size: int, pause: float
) -> None:
    # With a pause the child reads late: a prompt larger than the pipe buffer
    # then waits for room, while a smaller one is already in the pipe.
    prompt = "".join(chr(ord("a") + i % 26) for i in range(size))
    spec = make_spec(tmp_path, argv=(*script(READER), str(pause)), prompt=prompt)
    with trio.fail_after(15):
        outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.result == _digest(prompt)


async def test_a_multibyte_prompt_cut_by_the_pipe_buffer_arrives_whole(tmp_path: Path) -> None:
    # The first write ends wherever the pipe is full, possibly inside a
    # character; the rest must follow from exactly that byte.
    prompt = "ü✓" * (PIPE_BUFFER // 3)
    spec = make_spec(tmp_path, argv=(*script(READER), "0.2"), prompt=prompt)
    outcome = await execute(spec)
    assert outcome.result == _digest(prompt)


async def test_a_child_that_never_reads_a_large_prompt_is_not_an_error(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, argv=script("print('not reading')"), prompt="p" * (1024 * 1024))
    with trio.fail_after(15):
        outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.exit_code == 0
    assert outcome.result == "not reading\n"


async def test_a_child_that_closes_stdin_early_is_not_an_error(tmp_path: Path) -> None:
    code = (
        "import os, sys, time\n"
        "sys.stdin.buffer.read(10)\n"
        "os.close(0)\n"
        "time.sleep(0.2)\n"
        "print('closed stdin')\n"
    )
    spec = make_spec(tmp_path, argv=script(code), prompt="p" * (1024 * 1024))
    with trio.fail_after(15):
        outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.result == "closed stdin\n"


async def test_a_run_still_feeding_its_prompt_can_be_cancelled(tmp_path: Path) -> None:
    # The child never reads: the feeder waits for room until the cancel.
    spec = make_spec(
        tmp_path, argv=script("import time; time.sleep(30)"), prompt="p" * (1024 * 1024)
    )
    cancel = RunCancel()
    outcomes: list[ProcessOutcome] = []
    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        await nursery.start(run_into, outcomes, spec, cancel)
        await trio.sleep(0.3)
        cancel.cancel("stop feeding")
    [outcome] = outcomes
    assert outcome.status is Outcome.CANCELLED
    assert outcome.reason == "stop feeding"
    assert outcome.exit_code == -15
    assert time.monotonic() - started < 5


class _CancelOnSpawn:
    """A task status whose ``started`` cancels the run: a cancel landing at the spawn."""

    def __init__(self, cancel: RunCancel) -> None:
        self.cancel = cancel
        self.pid: int | None = None

    def started(self, value: int | None = None) -> None:
        self.pid = value
        self.cancel.cancel("cancelled while spawning")


async def test_a_cancel_landing_at_the_spawn_stops_the_child_at_once(tmp_path: Path) -> None:
    # The child can end only by the cancel's signal: one that read its prompt
    # at once could exit by itself (code 0) before a loaded event loop got to
    # the cancel, which is a run that finished, not one the cancel stopped.
    spec = make_spec(tmp_path, argv=(*script(READER), "30"), prompt="never needed")
    cancel = RunCancel()
    status = _CancelOnSpawn(cancel)
    started = time.monotonic()
    outcome = await execute(spec, cancel=cancel, task_status=status)
    assert status.pid is not None
    assert outcome.status is Outcome.CANCELLED
    assert outcome.reason == "cancelled while spawning"
    assert outcome.exit_code == -15
    assert time.monotonic() - started < 5
