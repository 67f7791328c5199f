"""A stand-in for Claude Code that fails, attempt by attempt, as its prompt says.

``python retry_agent.py RECORDS [resume args...]``

The prompt (stdin; its last line, after any preamble) is a comma-separated
list of endings, one an attempt of the run: the attempt number is the count
of lines ``RECORDS`` already holds for the run (``HERDSMAN_RUN_ID``); past
the list's end the last one repeats.
Each attempt appends ``{"run_id", "ending", "args"}`` to ``RECORDS``, then
prints, byte for byte, the stream of a recorded fixture
(tests/fixtures/agent_streams) and exits as that CLI did:

* ``overloaded``: every request answered 529 (exit 1);
* ``rate_limited``: every request answered 429 naming no reset (exit 1);
* ``success``: an answer with its usage (exit 0);
* ``crash``: the init line, then exit 3 with no API error in the stream;
* ``tool_then_overloaded``: a tool call (the first assistant line of
  ``claude-tools``), then the 529 stream: the agent may have done work.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

STREAMS = Path(__file__).parents[2] / "fixtures" / "agent_streams"


def lines_of(name: str) -> list[str]:
    return (STREAMS / f"{name}.stdout").read_text().splitlines(keepends=True)


def main() -> int:
    records = Path(sys.argv[1])
    # The prompt's last line: a run in a conversation's worktrees is given
    # herdsman's preamble before it.
    endings = sys.stdin.read().strip().splitlines()[-1].split(",")
    run_id = os.environ.get("HERDSMAN_RUN_ID", "")
    earlier = (
        [json.loads(line) for line in records.read_text().splitlines()] if records.exists() else []
    )
    attempt = sum(record["run_id"] == run_id for record in earlier)
    ending = endings[min(attempt, len(endings) - 1)]
    with records.open("a") as out:
        out.write(json.dumps({"run_id": run_id, "ending": ending, "args": sys.argv[2:]}) + "\n")
    if ending == "success":
        sys.stdout.writelines(lines_of("claude-standin-success"))
        return 0
    if ending == "overloaded":
        sys.stdout.writelines(lines_of("claude-standin-overloaded"))
        return 1
    if ending == "rate_limited":
        sys.stdout.writelines(lines_of("claude-standin-rate-limited"))
        return 1
    if ending == "crash":
        sys.stdout.writelines(lines_of("claude-standin-success")[:1])
        return 3
    if ending == "tool_then_overloaded":
        tool = next(line for line in lines_of("claude-tools") if '"tool_use"' in line)
        sys.stdout.write(tool)
        sys.stdout.writelines(lines_of("claude-standin-overloaded")[1:])
        return 1
    raise SystemExit(f"unknown ending {ending!r}")


if __name__ == "__main__":
    sys.exit(main())
