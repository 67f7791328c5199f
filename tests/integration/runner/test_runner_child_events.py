"""One epoll per run: whatever order output, EOFs and the exit arrive in, and
however they are batched into wakeups, every byte reaches its stream in order,
each stream is closed once, and the exit is seen."""

from __future__ import annotations

import io
import os
import subprocess
from types import SimpleNamespace
from typing import cast

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from herdsman.runtime.runner import ExcerptBuilder, PlainAdapter
from herdsman.runtime.runner.child import Child
from herdsman.runtime.runner.output import Output


class _Recording(Output):
    """An Output that also keeps each stream's bytes and counts its closes."""

    def __init__(self) -> None:
        super().__init__(io.BytesIO(), PlainAdapter(), ExcerptBuilder())
        self.received = {"stdout": bytearray(), "stderr": bytearray()}
        self.closes = {"stdout": 0, "stderr": 0}

    def feed(self, stream: str, chunk: bytes) -> None:
        self.received[stream] += chunk
        super().feed(stream, chunk)

    def close_stream(self, stream: str) -> None:
        self.closes[stream] += 1
        super().close_stream(stream)


# One step of the child's side: write to a stream, close it, or exit; and
# whether the writer lets the pump run before its next step.
_writes = st.tuples(
    st.sampled_from(["stdout", "stderr"]), st.binary(min_size=1, max_size=300), st.booleans()
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_writes, max_size=25),
    st.permutations(["close stdout", "close stderr", "exit"]),
    st.lists(st.integers(min_value=0, max_value=25), min_size=3, max_size=3),
)
def test_every_byte_and_end_arrives_whatever_the_order(
    writes: list[tuple[str, bytes, bool]], ends: list[str], positions: list[int]
) -> None:
    # The three ends go in at the given positions among the writes; a write
    # to a stream after its close is dropped (the pipe is closed).
    steps: list[tuple[str, bytes, bool]] = [(stream, data, pause) for stream, data, pause in writes]
    for end, position in sorted(zip(ends, positions, strict=True), key=lambda pair: pair[1]):
        steps.insert(min(position, len(steps)), (end, b"", True))
    sent = {"stdout": bytearray(), "stderr": bytearray()}

    async def main() -> _Recording:
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        exit_read, exit_write = os.pipe()  # closing the write end is the exit
        writers = {"stdout": out_write, "stderr": err_write, "exit": exit_write}
        # Only the pid is read from the Popen, and only by reap(), not used here.
        popen = cast("subprocess.Popen[bytes]", SimpleNamespace(pid=os.getpid()))
        child = Child(popen, exit_read, None, out_read, err_read)
        output = _Recording()

        async def child_side() -> None:
            for step, data, pause in steps:
                if step in writers and data:
                    if writers[step] >= 0:
                        os.write(writers[step], data)
                        sent[step] += data
                else:
                    name = step.removeprefix("close ")
                    os.close(writers[name])
                    writers[name] = -1
                if pause:
                    await trio.sleep(0)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(child_side)
                with trio.fail_after(10):
                    await child.pump(output, child.has_exited)
                    await child.pump(output, output.all_closed)
        finally:
            child.close()
        return output

    output = trio.run(main)
    assert output.received == sent
    assert output.closes == {"stdout": 1, "stderr": 1}
    assert output.all_closed()
