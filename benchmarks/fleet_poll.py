"""What telling a member which of its queued runs left the queue costs, per poll.

Every poll, a fleet member passes the ids its scheduler holds queued, and
the ledger answers which of them are no longer queued (claimed or ended by
another member, cancelled, pruned): one statement with one array parameter
(``FleetStore.poll``, docs/fleet.md). This prints, for each number of runs
queued locally (all queued in the ledger, 1 % of them claimed by another
member since):

* the mean time of one poll without the ids (what a poll cost before) and
  with them, and the difference;
* the mean time of reading the ids out of a scheduler holding that many
  queued runs (in the member's event loop).

Run: python benchmarks/fleet_poll.py --store-url URL [--runs 1000,10000] [--repeat 20]
(URL: a database the role may create schemas in; the password, if any, in
PGPASSWORD or ~/.pgpass. Each size uses a fresh schema, dropped after.)
"""

from __future__ import annotations

import argparse
import time
from functools import partial

from fleet import scratch_schema
from herdsman.core import RunRequest, Scheduler
from herdsman.core.scheduler import Limits
from herdsman.runtime.store import NewRun, Store
from herdsman.runtime.store.fleet import FleetStore


def submit(run_id: str, store: Store) -> None:
    store.submit(NewRun(id=run_id, provider="claude", prompt="p", conversation=run_id), 1.0)


def mean_ms(samples: list[float]) -> float:
    return 1000 * sum(samples) / len(samples)


def measure(url: str, runs: int, repeat: int) -> str:
    """One line of figures for ``runs`` runs queued locally."""
    with scratch_schema(url) as scoped:
        other = FleetStore(scoped, member_id="other", host="bench", pid=1, lease=3600)
        member = FleetStore(scoped, member_id="member", host="bench", pid=2, lease=3600)
        try:
            ids = [f"r{n}" for n in range(runs)]
            for first in range(0, runs, 500):  # one transaction per 500
                other.apply([partial(submit, run_id) for run_id in ids[first : first + 500]])
            gone = ids[:: max(1, runs // (runs // 100 or 1))][: runs // 100 or 1]
            claimed = other.claim_many([(run_id, None) for run_id in gone], 2.0).claimed
            assert len(claimed) == len(gone)
            cursor = member.poll(0).cursor
            scheduler = Scheduler(Limits({"claude": 0}))
            for n, run_id in enumerate(ids):
                scheduler.submit(RunRequest(run_id, "claude", run_id, None, "default"), seq=n + 1)
            bare, full, local = [], [], []
            for _ in range(repeat):
                began = time.perf_counter()
                held = [run.id for run in scheduler.queued_runs()]
                local.append(time.perf_counter() - began)
                began = time.perf_counter()
                member.poll(cursor)
                bare.append(time.perf_counter() - began)
                began = time.perf_counter()
                polled = member.poll(cursor, held)
                full.append(time.perf_counter() - began)
                assert polled.left == gone, polled.left[:5]
        finally:
            other.close()
            member.close()
    return (
        f"{runs:>7} runs queued locally, {len(gone)} left: poll {mean_ms(bare):7.2f} ms"
        f" without the ids, {mean_ms(full):7.2f} ms with them"
        f" (+{mean_ms(full) - mean_ms(bare):.2f} ms);"
        f" reading the ids from the scheduler {mean_ms(local):6.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--runs", default="1000,10000", help="runs queued locally, per size")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"means of {args.repeat} repetitions")
    for size in args.runs.split(","):
        print(measure(args.store_url, int(size), args.repeat))
