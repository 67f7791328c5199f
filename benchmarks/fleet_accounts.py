"""What counting accounts fleet-wide costs a member: its per-poll read, and its claims.

A fleet member reads, at every poll, the rests in force and every run the
other members charged to an account in the longest quota window, and hands
them to its account core (herdsman/runtime/fleet_accounts.py). With budgets,
each claim also counts the account's usage in the ledger. This prints, for
each number of runs in the window (all started by another member, spread
over four accounts of one provider):

* the mean time of one poll's account read (the ledger query and the rows
  brought over) and of handing it to the account core;
* the mean time of one claim transaction of one run on a budgeted account,
  and without a budget, on the same ledger.

Run: python benchmarks/fleet_accounts.py --store-url URL [--runs 1000,10000] [--repeat 20]
(URL: a database the role may create schemas in; the password, if any, in
PGPASSWORD or ~/.pgpass. Each size uses a fresh schema, dropped after.)
"""

from __future__ import annotations

import argparse
import time
import uuid
from functools import partial

import psycopg

from fleet import with_schema
from herdsman.core.accounts import AccountBook, AccountSpec
from herdsman.runtime.fleet_accounts import apply_fleet_accounts, read_fleet_accounts
from herdsman.runtime.store import NewRun, RunEnd, RunStatus, Store
from herdsman.runtime.store.fleet import AccountBudget, ClaimRules, FleetStore

WINDOW = 5 * 3600.0
ACCOUNTS = ("a", "b", "c", "d")


def fill(store: FleetStore, runs: int, now: float) -> None:
    """``runs`` runs of this member over the last window, finished, on four accounts."""
    for first in range(0, runs, 500):
        ids = [f"old{n}" for n in range(first, min(runs, first + 500))]
        at = now - WINDOW + (first + 1) * (WINDOW / (runs + 1))
        store.apply(
            [partial(submit, run_id, at) for run_id in ids]  # one transaction per 500
        )
        claimed = store.claim_many(
            [(run_id, ACCOUNTS[n % len(ACCOUNTS)]) for n, run_id in enumerate(ids)], at
        )
        assert len(claimed.claimed) == len(ids), claimed.refused
        store.apply([partial(finish, run_id, at + 1) for run_id in ids])


def submit(run_id: str, at: float, store: Store) -> None:
    store.submit(NewRun(id=run_id, provider="claude", prompt="p"), at)


def finish(run_id: str, at: float, store: Store) -> None:
    store.finish(run_id, RunEnd(RunStatus.SUCCEEDED, exit_code=0), at)


def mean_ms(samples: list[float]) -> float:
    return 1000 * sum(samples) / len(samples)


def measure(url: str, runs: int, repeat: int) -> None:
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        scoped = with_schema(url, schema)
        now = time.time()
        other = FleetStore(scoped, member_id="other", host="bench", pid=1, lease=3600)
        member = FleetStore(scoped, member_id="member", host="bench", pid=2, lease=3600)
        try:
            fill(other, runs, now)
            book = AccountBook(
                {"claude": [AccountSpec(name, window=WINDOW, budget=10**9) for name in ACCOUNTS]}
            )
            reads, applies = [], []
            for _ in range(repeat):
                began = time.perf_counter()
                state = read_fleet_accounts(member, now, WINDOW)
                read = time.perf_counter()
                apply_fleet_accounts(book, state, now)
                reads.append(read - began)
                applies.append(time.perf_counter() - read)
            assert len(state.elsewhere) == runs
            budgeted = ClaimRules(
                account_budgets={
                    ("claude", name): AccountBudget(WINDOW, 10**9) for name in ACCOUNTS
                }
            )
            claims: dict[str, list[float]] = {"budget": [], "none": []}
            for n in range(repeat):
                for kind, rules in (("budget", budgeted), ("none", ClaimRules())):
                    run_id = f"new-{kind}-{n}"
                    member.submit(NewRun(id=run_id, provider="claude", prompt="p"), now)
                    began = time.perf_counter()
                    result = member.claim_many([(run_id, "a")], now, rules)
                    claims[kind].append(time.perf_counter() - began)
                    assert result.claimed, result
                    member.finish(run_id, RunEnd(RunStatus.SUCCEEDED, exit_code=0), now)
            print(
                f"{runs:>7} runs in the window: poll read {mean_ms(reads):7.2f} ms,"
                f" into the core {mean_ms(applies):6.2f} ms;"
                f" one claim {mean_ms(claims['budget']):6.2f} ms with a budget,"
                f" {mean_ms(claims['none']):6.2f} ms without"
            )
        finally:
            other.close()
            member.close()
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--runs", default="100,1000,10000", help="runs in the window, per size")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"accounts with a {WINDOW / 3600:g} h window; means of {args.repeat} repetitions")
    for runs in (int(n) for n in args.runs.split(",")):
        measure(args.store_url, runs, args.repeat)


if __name__ == "__main__":
    main()
