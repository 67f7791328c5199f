"""Claims per second on a PostgreSQL ledger with 1, 2 and 4 fleet members.

Each member is a process with its own FleetStore (its own connection), as a
supervisor on its own machine would be. The queue is submitted first: most
runs in conversations of their own, a fifth on a few hot conversations, and
agents shared by many runs (agent exclusivity on), so claims meet busy lanes
and earlier queued runs. Then all members start at once and drain it: each
takes the earliest runs that head their lanes (as every local scheduler
would), claims up to ``--burst`` runs per transaction,
and records each claimed run as finished at once (a run of zero length), so
the figure is the ledger's ceiling, not the agents'. Members compete for the
same runs, so many claims are refused as already taken: the refusals are
printed beside the rate.

Printed per member count: runs claimed per second fleet-wide (first claim to
the last run claimed, by the slowest member), claim transactions per second,
refusals by reason, and the mean time of one claim transaction.

Run: python benchmarks/fleet.py --store-url URL [--runs N] [--burst B] [--members 1,2,4]
(URL: a database the role may create schemas in; the password, if any, in
the URL, PGPASSWORD or ~/.pgpass. Each count uses a fresh schema, dropped after.)
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Barrier

import psycopg

from herdsman.core.runs import RunRequest, exclusion_keys
from herdsman.runtime.store import NewRun, RunEnd, RunRecord, RunStatus
from herdsman.runtime.store.fleet import ClaimRules, FleetStore, Refusal

T0 = 1_700_000_000.0
RULES = ClaimRules(agent_exclusive=True)


def with_schema(url: str, schema: str) -> str:
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options=-csearch_path%3D{schema}"


@contextmanager
def scratch_schema(url: str) -> Iterator[str]:
    """A fresh schema for one measurement, dropped after: the URL that uses it."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(url, schema)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def fill(url: str, runs: int) -> None:
    """Submit the queue: conversations mostly of their own, some hot; shared agents."""
    rng = random.Random(9)
    store = FleetStore(url, member_id="filler", host="bench", pid=0, lease=600)
    try:
        for n in range(runs):
            hot = rng.random() < 0.2
            conversation = f"hot{rng.randrange(4)}" if hot else f"c{n}"
            agent = f"agent{rng.randrange(16)}" if rng.random() < 0.5 else None
            new = NewRun(
                id=f"r{n}", provider="claude", prompt="p", conversation=conversation, agent=agent
            )
            store.submit(new, T0)
        store.leave()
    finally:
        store.close()


def lanes(record: RunRecord) -> tuple[str, ...]:
    request = RunRequest(
        record.id, record.provider, record.conversation, record.agent, record.workspace
    )
    return exclusion_keys(request, agent_exclusive=RULES.agent_exclusive)


def heads(pending: dict[str, tuple[str, ...]], burst: int) -> list[str]:
    """The first ``burst`` runs that head all their lanes (what a local scheduler offers)."""
    seen: set[str] = set()
    out: list[str] = []
    for run_id, keys in pending.items():  # submission order
        if not seen.intersection(keys):
            out.append(run_id)
            if len(out) == burst:
                break
        seen.update(keys)
    return out


def member(
    url: str, number: int, burst: int, barrier: Barrier, out: multiprocessing.Queue[object]
) -> None:
    store = FleetStore(
        url, member_id=f"m{number}-{uuid.uuid4().hex[:6]}", host="bench", pid=number, lease=600
    )
    try:
        pending = {r.id: lanes(r) for r in store.queued_in_order()}
        refusals: Counter[str] = Counter()
        claimed = transactions = 0
        in_claims = 0.0
        barrier.wait()
        started = time.perf_counter()
        while pending:
            batch = heads(pending, burst)
            before = time.perf_counter()
            result = store.claim_many([(run_id, None) for run_id in batch], T0 + 1, RULES)
            in_claims += time.perf_counter() - before
            transactions += 1
            for record in result.claimed:
                store.finish(record.id, RunEnd(RunStatus.SUCCEEDED, exit_code=0), T0 + 2)
                del pending[record.id]
            claimed += len(result.claimed)
            refusals.update(reason.value for _, reason in result.refused)
            for run_id, why in result.refused:
                if why is Refusal.GONE:
                    del pending[run_id]
            if len(result.refused) == len(batch) and all(
                why is not Refusal.GONE for _, why in result.refused
            ):
                time.sleep(0.001)  # its lanes are held by other members: wait for them
        elapsed = time.perf_counter() - started
        out.put((claimed, transactions, dict(refusals), in_claims, elapsed))
    finally:
        store.close()


def measure(url: str, members: int, runs: int, burst: int) -> None:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        scoped = with_schema(url, schema)
        fill(scoped, runs)
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(members)
        out: multiprocessing.Queue[object] = context.Queue()
        processes = [
            context.Process(target=member, args=(scoped, n, burst, barrier, out))
            for n in range(members)
        ]
        for process in processes:
            process.start()
        results = [out.get() for _ in processes]
        for process in processes:
            process.join()
        claimed = sum(r[0] for r in results)  # type: ignore[index]
        transactions = sum(r[1] for r in results)  # type: ignore[index]
        refusals: Counter[str] = Counter()
        for r in results:
            refusals.update(r[2])  # type: ignore[index]
        in_claims = sum(r[3] for r in results)  # type: ignore[index]
        elapsed = max(r[4] for r in results)  # type: ignore[index]
        assert claimed == runs, (claimed, runs)
        print(
            f"{members} member(s): {claimed / elapsed:8.0f} claims/s"
            f"  {transactions / elapsed:7.0f} claim transactions/s"
            f"  {1000 * in_claims / transactions:6.2f} ms per claim transaction"
            f"  refused: {dict(sorted(refusals.items()))}"
        )
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-url", required=True, help="a PostgreSQL URL")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--burst", type=int, default=8, help="runs per claim transaction")
    parser.add_argument("--members", default="1,2,4", help="member counts to measure")
    args = parser.parse_args()
    print(f"{args.runs} runs, up to {args.burst} per claim, each finished as soon as claimed")
    for count in (int(c) for c in args.members.split(",")):
        measure(args.store_url, count, args.runs, args.burst)


if __name__ == "__main__":
    main()
