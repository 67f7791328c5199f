"""Large outputs and prompts: bounded memory, no deadlock, nothing lost."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import trio
from runner_helpers import make_spec, script

from herdsman.runtime.runner import execute
from herdsman.runtime.runner.excerpt import EXCERPT_LIMIT
from herdsman.runtime.runner.protocols import PLAIN_REPLY_LIMIT
from herdsman.runtime.runner.spec import Outcome

LINES = 50 * 1024  # of 1 KiB each: 50 MiB in all


def _line(i: int) -> bytes:
    return b"%08d " % i + b"x" * 1014 + b"\n"


# Runs execute() in a fresh interpreter and reports its peak RSS, so memory is
# measured without tracemalloc (which made this test six times slower).
DRIVER = """
import json, resource, sys, trio
from herdsman.runtime.runner import ProcessSpec, execute
lines, log_path = int(sys.argv[1]), sys.argv[2]
code = (
    "import sys\\n"
    "out = sys.stdout.buffer\\n"
    f"for i in range({lines}):\\n"
    "    out.write(b'%08d ' % i + b'x' * 1014 + b'\\\\n')\\n"
)
spec = ProcessSpec(argv=[sys.executable, "-c", code], env={}, cwd=".", prompt="",
                   timeout=60, idle_timeout=None, log_path=log_path, protocol="plain")
outcome = trio.run(execute, spec)
print(json.dumps({"status": outcome.status.value, "excerpt": outcome.excerpt,
                  "result_tail": (outcome.result or "")[-200:],
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


async def _drive(lines: int, log_path: Path) -> dict[str, Any]:
    done = await trio.run_process(
        [sys.executable, "-c", DRIVER, str(lines), str(log_path)], capture_stdout=True
    )
    report: dict[str, Any] = json.loads(done.stdout)
    return report


async def test_fifty_megabytes_of_output_stream_to_the_log_in_bounded_memory(
    tmp_path: Path,
) -> None:
    small = await _drive(100, tmp_path / "small.log")
    big = await _drive(LINES, tmp_path / "big.log")
    assert small["status"] == big["status"] == "succeeded"
    # The reply keeps 1 MiB and the excerpt 4 KiB; everything else only
    # passes through. Keeping the output would cost 50 MiB or more.
    grown_kib = big["maxrss_kib"] - small["maxrss_kib"]
    assert grown_kib < 16 * 1024, grown_kib
    log_path = tmp_path / "big.log"
    expected = hashlib.sha256()
    for i in range(LINES):
        expected.update(_line(i))
    assert log_path.stat().st_size == LINES * 1024
    assert hashlib.sha256(log_path.read_bytes()).hexdigest() == expected.hexdigest()
    excerpt: str = big["excerpt"]
    assert len(excerpt.encode()) <= EXCERPT_LIMIT
    # Head and tail lines are shown cut to 512 bytes, marked with an ellipsis.
    assert excerpt.startswith("00000000 xxx")
    assert excerpt.splitlines()[-1].startswith(f"{LINES - 1:08d} xxx")
    assert excerpt.endswith("x…")
    assert f"{LINES - 2:08d} xxx" in excerpt
    assert big["result_tail"].endswith(
        f"[… reply truncated: kept the first {PLAIN_REPLY_LIMIT} of {LINES * 1024} bytes "
        "of stdout; the log has all of it]"
    )


async def test_a_one_megabyte_prompt_does_not_deadlock(tmp_path: Path) -> None:
    # The child writes 1 MiB before it reads its stdin: a runner that wrote
    # the whole prompt before reading stdout would wait forever on both pipes.
    prompt = "p" * (1024 * 1024)
    code = (
        "import sys\n"
        "sys.stderr.buffer.write(b'e' * (1024 * 1024)); sys.stderr.flush()\n"
        "data = sys.stdin.buffer.read()\n"
        "print(len(data), hashlib.sha256(data).hexdigest())\n"
    )
    spec = make_spec(tmp_path, argv=script("import hashlib\n" + code), prompt=prompt)
    with trio.fail_after(15):
        outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert outcome.result == f"{len(prompt)} {hashlib.sha256(prompt.encode()).hexdigest()}\n"
    assert spec.log_path.stat().st_size == 1024 * 1024 + len(outcome.result)
