"""A stand-in agent that records its own life, for the fencing tests.

``stamp_agent.py OUTDIR`` reads its prompt on stdin; the last line is how
many seconds to live. It forks a child (agents start tools, in their
process group), and each of the two processes writes a file of its own,
``OUTDIR/RUN_ID.PID``: its start time on the first line, then, every 10 ms,
the time it was last alive on the second (overwritten in place). A process
killed with SIGKILL writes nothing more, so the second line is the last
moment it was seen running, to within about 10 ms.
"""

from __future__ import annotations

import os
import sys
import time

#: "1764600000.123456\n": wall-clock seconds, fixed width for centuries.
WIDTH = 18
BEAT = 0.01


def live(outdir: str, run_id: str, seconds: float) -> None:
    """Write the start and then heartbeats for ``seconds``."""
    fd = os.open(f"{outdir}/{run_id}.{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    start = time.time()
    os.write(fd, f"{start:17.6f}\n".encode())
    while True:
        now = time.time()
        os.pwrite(fd, f"{now:17.6f}\n".encode(), WIDTH)
        if now - start >= seconds:
            break
        time.sleep(BEAT)
    os.close(fd)


def main() -> int:
    """Live for as long as the prompt says, with a child; exit 0."""
    outdir = sys.argv[1]
    run_id = os.environ["HERDSMAN_RUN_ID"]
    lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
    seconds = float(lines[-1])
    child = os.fork()
    live(outdir, run_id, seconds)
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    print(f"lived {seconds} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
