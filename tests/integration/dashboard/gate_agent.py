"""A stand-in agent that runs until the test opens its gate.

``python gate_agent.py GATES``: reads the prompt on stdin, says so, and waits
until the file ``GATES/<prompt's last line>`` exists, then replies and exits 0. The test
decides when each run ends, so a page can be watched in each state with no
timing assumed. It gives up (exit 1) after two minutes, so a test that fails
leaves no agent behind for long.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main() -> int:
    gates = Path(sys.argv[1])
    # The last line: the supervisor may put a preamble (the run's checkouts) before it.
    prompt = sys.stdin.read().strip().splitlines()[-1]
    print(f"working on {prompt}", flush=True)
    deadline = time.monotonic() + 120
    while not (gates / prompt).exists():
        if time.monotonic() > deadline:
            print("the gate never opened", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"finished {prompt}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
