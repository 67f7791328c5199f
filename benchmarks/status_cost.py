"""What one status call costs the scheduler with 100,000 runs queued.

``GET /v1/status`` reads :meth:`Scheduler.snapshot`. Printed per queue
shape: milliseconds per snapshot (the best of ``--repeat`` rounds of
``--calls`` calls each) and how many lanes the snapshot lists. Shapes:

* ``few lanes``: every run in one of 100 conversations, 8 running;
* ``a lane each``: every run in a conversation of its own;
* ``lone runs``: no conversation, no agent (each listed as ``run:...``).

The snapshot lists every lane with a queued run, so the last two shapes
cost in proportion to their listing; the first must not cost a walk of
the queue.

Run: python benchmarks/status_cost.py [--runs N] [--calls C] [--repeat R]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from herdsman.core import Limits, RunRequest, Scheduler


def build(runs: int, conversation: Callable[[int], str | None]) -> Scheduler:
    sched = Scheduler(Limits({"p": 8}))
    for n in range(runs):
        sched.submit(RunRequest(f"r{n}", "p", conversation(n)))
    sched.take_startable()
    return sched


def cost(sched: Scheduler, calls: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        for _ in range(calls):
            sched.snapshot()
        best = min(best, (time.perf_counter() - began) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    shapes: dict[str, Callable[[int], str | None]] = {
        "few lanes": lambda n: f"c{n % 100}",
        "a lane each": lambda n: f"c{n}",
        "lone runs": lambda n: None,
    }
    print(f"{args.runs} runs queued (8 running); one Scheduler.snapshot():")
    for name, conversation in shapes.items():
        sched = build(args.runs, conversation)
        seconds = cost(sched, args.calls, args.repeat)
        lanes = len(sched.snapshot().queued_by_lane)
        print(f"  {name:<12} {seconds * 1000:9.3f} ms   {lanes:>7} lanes listed")


if __name__ == "__main__":
    main()
