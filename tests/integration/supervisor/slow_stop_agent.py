"""A stand-in agent that takes its time to stop: ``python slow_stop_agent.py READY``.

The prompt's last word is how many seconds it takes, once sent SIGTERM, to
exit; until then it runs for a minute. Two runs stopped together then end
in the order their stop times say, not in the order they were stopped.
Once it can be stopped so, it makes the file ``READY/<run id>``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType


def main() -> int:
    """Run until stopped; take the prompt's number of seconds to stop."""
    words = sys.stdin.read().split()
    stop_after = float(words[-1]) if words else 0.0

    def on_term(signum: int, frame: FrameType | None) -> None:
        time.sleep(stop_after)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    (Path(sys.argv[1]) / os.environ["HERDSMAN_RUN_ID"]).touch()
    time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
