"""The fleet claim rules under interleavings and races, against a real server.

Several FleetStores on one schema act as the members of a fleet. One test
interleaves submits, claims, finishes, cancels, prunes, polls and lapsed
members drawn by hypothesis, and compares every claim's decision with a
plain model of the rules (docs/scheduling.md, fleet-wide) and every
member's polled view of the queue with the ledger's queue; the other races members' claims in
threads and checks the ledger after: no run claimed twice, no two running
runs sharing a key, FIFO per key, caps.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from herdsman.core.runs import RunRequest, busy_keys, exclusion_keys
from herdsman.runtime.store import NewRun, RunEnd, RunRecord, RunStatus, Store, StoreConflict
from herdsman.runtime.store.fleet import ClaimRules, FleetStore, LeaseExpired, Refusal
from postgres_support import fresh_schema

T0 = 1_700_000_000.0
PROVIDERS = ("claude", "codex")
RULES = ClaimRules(agent_exclusive=True, provider_caps={"claude": 2, "codex": 3})


@contextmanager
def members(server: str, count: int) -> Iterator[list[FleetStore]]:
    with fresh_schema(server) as url:
        stores = [
            FleetStore(
                url, member_id=f"m{n}-{uuid.uuid4().hex[:6]}", host=f"m{n}", pid=n, lease=600
            )
            for n in range(count)
        ]
        try:
            yield stores
        finally:
            for store in stores:
                store.close()


def request_of(record: RunRecord | NewRun) -> RunRequest:
    return RunRequest(
        record.id, record.provider, record.conversation, record.agent, record.workspace
    )


def keys(record: RunRecord) -> tuple[str, ...]:
    return exclusion_keys(request_of(record), agent_exclusive=RULES.agent_exclusive)


@attrs.define
class Model:
    """The fleet's runs as the rules see them: status, holder and keys, by seq."""

    runs: dict[str, RunRecord] = attrs.field(factory=dict)
    holder: dict[str, int] = attrs.field(factory=dict)

    def expected(self, run_id: str) -> Refusal | None:
        run = self.runs.get(run_id)
        if run is None:  # pruned: nothing to start
            return Refusal.GONE
        if run.status is not RunStatus.QUEUED:
            return Refusal.GONE
        mine = set(keys(run))
        others = [r for r in self.runs.values() if r.id != run_id and mine & set(keys(r))]
        if any(r.status is RunStatus.RUNNING for r in others):
            return Refusal.LANE_BUSY
        if any(r.status is RunStatus.QUEUED and r.seq < run.seq for r in others):
            return Refusal.EARLIER_QUEUED
        running = sum(
            1
            for r in self.runs.values()
            if r.status is RunStatus.RUNNING and r.provider == run.provider
        )
        if running >= RULES.provider_caps[run.provider]:
            return Refusal.PROVIDER_CAP
        return None

    def busy(self, new: NewRun) -> bool:
        """``on_busy = "skip"``: a queued or running run shares its conversation or agent key."""
        mine = set(busy_keys(request_of(new), agent_exclusive=RULES.agent_exclusive))
        return any(
            r.status in (RunStatus.QUEUED, RunStatus.RUNNING)
            and mine & set(busy_keys(request_of(r), agent_exclusive=RULES.agent_exclusive))
            for r in self.runs.values()
        )


submit_op = st.tuples(
    st.just("submit"),
    st.one_of(st.none(), st.sampled_from("ab")),  # conversation
    st.one_of(st.none(), st.sampled_from("xy")),  # agent
    st.sampled_from(PROVIDERS),
)
# Submits with on_busy = "skip" by any member, one to three in one batch
# (the supervisor's group commit): each sees the ones before it.
lane = st.tuples(
    st.one_of(st.none(), st.sampled_from("ab")), st.one_of(st.none(), st.sampled_from("xy"))
)
skip_op = st.tuples(
    st.just("skip_submit"), st.integers(0, 3), st.lists(lane, min_size=1, max_size=3)
)
claim_op = st.tuples(
    st.just("claim"), st.integers(0, 3), st.lists(st.integers(0, 30), min_size=1, max_size=4)
)
# Most finishes name a running run (any member may try, only its holder may
# succeed); some name any run at all.
finish_op = st.tuples(st.just("finish"), st.integers(0, 3), st.integers(0, 30), st.booleans())
cancel_op = st.tuples(st.just("cancel"), st.integers(0, 30))
lapse_op = st.tuples(st.just("lapse"), st.integers(0, 3))
poll_op = st.tuples(st.just("poll"), st.integers(0, 3))
prune_op = st.tuples(st.just("prune"))
operations = st.lists(
    st.one_of(
        submit_op,
        submit_op,
        skip_op,
        claim_op,
        claim_op,
        finish_op,
        cancel_op,
        lapse_op,
        poll_op,
        poll_op,
        prune_op,
    ),
    min_size=5,
    max_size=40,
)


@attrs.define
class Harness:
    """Members acting on one ledger, one operation at a time, checked against the model."""

    stores: list[FleetStore]
    model: Model = attrs.field(factory=Model)
    order: list[str] = attrs.field(factory=list)  # run ids in submission order
    lapsed: set[int] = attrs.field(factory=set)
    now: float = T0
    # Each member's view of the queue: its poll cursor and the runs it holds queued.
    views: dict[int, tuple[int, list[str]]] = attrs.field(factory=dict)

    @property
    def live(self) -> list[int]:
        return [n for n in range(len(self.stores)) if n not in self.lapsed]

    def pick(self, index: int) -> str:
        return self.order[index % len(self.order)]

    @property
    def kept(self) -> list[str]:
        """Runs still in the ledger (not pruned), in submission order."""
        return [run_id for run_id in self.order if run_id in self.model.runs]

    def submit(self, conversation: str | None, agent: str | None, provider: str) -> None:
        run_id = f"r{len(self.order)}"
        new = NewRun(
            id=run_id, provider=provider, prompt="p", conversation=conversation, agent=agent
        )
        record, created = self.stores[self.live[0]].submit(new, self.now)
        assert created
        assert all(record.seq > r.seq for r in self.model.runs.values())
        self.model.runs[run_id] = record
        self.order.append(run_id)

    def skip_submit(self, who: int, lanes: list[tuple[str | None, str | None]]) -> None:
        n = self.live[who % len(self.live)]
        news = [
            NewRun(
                id=f"r{len(self.order) + i}",
                provider="claude",
                prompt="p",
                conversation=conversation,
                agent=agent,
            )
            for i, (conversation, agent) in enumerate(lanes)
        ]

        def submit(new: NewRun, store: Store) -> tuple[RunRecord, bool]:
            return self.stores[n].submit_unless_busy(
                new, self.now, "busy", agent_exclusive=RULES.agent_exclusive
            )

        results = self.stores[n].apply([partial(submit, new) for new in news])
        for new, result in zip(news, results, strict=True):
            record, created = result.unwrap()
            assert created
            want = RunStatus.SKIPPED if self.model.busy(new) else RunStatus.QUEUED
            assert record.status is want, (new, self.model.runs)
            self.model.runs[new.id] = record
            self.order.append(new.id)

    def claim(self, who: int, picks: list[int]) -> None:
        if not self.order:
            return
        n = who % len(self.stores)
        # A member claims each id once per batch.
        items = list(dict.fromkeys(self.pick(i) for i in picks))
        if n in self.lapsed:
            try:
                self.stores[n].claim_many([(i, None) for i in items], self.now, RULES)
            except LeaseExpired:
                return
            raise AssertionError("a lapsed member claimed")
        result = self.stores[n].claim_many([(i, None) for i in items], self.now, RULES)
        refused = dict(result.refused)
        for run_id in items:
            want = self.model.expected(run_id)
            assert refused.get(run_id) == want, (run_id, want, result)
            if want is None:
                self.set_status(run_id, RunStatus.RUNNING)
                self.model.holder[run_id] = n

    def finish(self, who: int, pick: int, any_run: bool) -> None:
        running = [i for i in self.kept if self.model.runs[i].status is RunStatus.RUNNING]
        choices = self.kept if any_run else running
        if not choices:
            return
        n, run_id = who % len(self.stores), choices[pick % len(choices)]
        held = self.model.holder.get(run_id) == n
        held = held and self.model.runs[run_id].status is RunStatus.RUNNING
        try:
            self.stores[n].finish(run_id, RunEnd(RunStatus.SUCCEEDED, exit_code=0), self.now)
        except StoreConflict:
            assert not held, run_id
        else:
            assert held, f"{run_id} finished by m{n}, which does not hold it"
            self.set_status(run_id, RunStatus.SUCCEEDED)

    def cancel(self, pick: int) -> None:
        if not self.kept:
            return
        run_id = self.kept[pick % len(self.kept)]
        queued = self.model.runs[run_id].status is RunStatus.QUEUED
        try:
            self.stores[self.live[0]].cancel_queued(run_id, self.now, "test")
        except StoreConflict:
            assert not queued
        else:
            assert queued
            self.set_status(run_id, RunStatus.CANCELLED)

    def lapse(self, who: int) -> None:
        n = who % len(self.stores)
        if n in self.lapsed or len(self.live) == 1:
            return
        self.stores[n].leave()
        self.lapsed.add(n)
        lost = self.stores[self.live[0]].expire_lapsed(self.now)
        expected = sorted(
            (r.seq, r.id)
            for r in self.model.runs.values()
            if r.status is RunStatus.RUNNING and self.model.holder.get(r.id) == n
        )
        assert [(r.seq, r.id) for r in lost] == expected
        for record in lost:
            assert record.reason == f"supervisor m{n}:{n} lease expired"
            self.set_status(record.id, RunStatus.LOST)

    def poll(self, who: int) -> None:
        """A member's poll: its view of the queue becomes exactly the ledger's queue."""
        n = who % len(self.stores)
        cursor, queued = self.views.get(n, (0, []))
        polled = self.stores[n].poll(cursor, queued)
        assert polled.left == [i for i in queued if i in set(polled.left)]  # in the order given
        left = set(polled.left)
        view = [i for i in queued if i not in left]
        view += [r.id for r in polled.runs if r.id not in view]
        self.views[n] = (polled.cursor, view)
        in_ledger = {i for i, r in self.model.runs.items() if r.status is RunStatus.QUEUED}
        assert set(view) == in_ledger, (view, in_ledger)
        assert len(view) == len(set(view))

    def prune(self) -> None:
        """Every ended run goes (all ended before now): a claim of one finds it gone."""
        self.stores[self.live[0]].prune(self.now + 0.5)
        for run_id, record in list(self.model.runs.items()):
            if record.status not in (RunStatus.QUEUED, RunStatus.RUNNING):
                del self.model.runs[run_id]

    def set_status(self, run_id: str, status: RunStatus) -> None:
        self.model.runs[run_id] = attrs.evolve(self.model.runs[run_id], status=status)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(count=st.integers(2, 4), ops=operations)
def test_every_claim_decides_as_the_fleet_wide_rules_say(
    postgres_server: str, count: int, ops: Sequence[tuple[Any, ...]]
) -> None:
    with members(postgres_server, count) as stores:
        harness = Harness(stores)
        for kind, *args in ops:
            harness.now += 1
            getattr(harness, kind)(*args)
            check_ledger(stores[harness.live[0]], harness.model)


def check_ledger(store: FleetStore, model: Model) -> None:
    """The ledger agrees with the model, and no rule is broken in it."""
    records = {r.id: r for r in store.list_runs(limit=1000)}
    assert {i: r.status for i, r in records.items()} == {i: r.status for i, r in model.runs.items()}
    running = [r for r in records.values() if r.status is RunStatus.RUNNING]
    held: set[str] = set()
    for record in running:
        for key in keys(record):
            assert key not in held, f"two running runs share {key}"
            held.add(key)
    for provider, cap in RULES.provider_caps.items():
        assert sum(1 for r in running if r.provider == provider) <= cap
    # No run is ever started twice (nothing here re-queues).
    assert all(r.attempts <= 1 for r in records.values())


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    count=st.integers(2, 4),
    lanes=st.lists(
        st.tuples(st.sampled_from([None, "a", "b", "c"]), st.sampled_from([None, "x", "y"])),
        min_size=4,
        max_size=14,
    ),
    seed=st.randoms(use_true_random=False),
)
def test_members_racing_for_one_queue_break_no_rule(
    postgres_server: str,
    count: int,
    lanes: list[tuple[str | None, str | None]],
    seed: object,
) -> None:
    """Members claim the whole queue at once, each in its own order, in threads.

    Afterwards: every run claimed at most once, by one member; no two running
    runs share a key; a running run has no earlier queued run on its lanes
    (nothing finished meanwhile, so FIFO per key shows in the final state);
    the caps hold.
    """
    import random

    assert isinstance(seed, random.Random)
    with members(postgres_server, count) as stores:
        run_ids = []
        for n, (conversation, agent) in enumerate(lanes):
            run_id = f"r{n}"
            provider = PROVIDERS[n % 2]
            stores[n % count].submit(
                NewRun(
                    id=run_id, provider=provider, prompt="p", conversation=conversation, agent=agent
                ),
                T0,
            )
            run_ids.append(run_id)
        orders = [seed.sample(run_ids, len(run_ids)) for _ in range(count)]
        won: list[list[str]] = [[] for _ in range(count)]
        barrier = threading.Barrier(count)

        def race(n: int) -> None:
            barrier.wait()
            # One id at a time and in bursts: both are what supervisors do.
            for start in range(0, len(orders[n]), 1 + n % 3):
                burst = orders[n][start : start + 1 + n % 3]
                result = stores[n].claim_many([(i, f"acct{n}") for i in burst], T0 + 1, RULES)
                won[n].extend(r.id for r in result.claimed)

        threads = [threading.Thread(target=race, args=(n,)) for n in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        claims = [run_id for ids in won for run_id in ids]
        assert len(claims) == len(set(claims)), "a run was claimed twice"
        records = {r.id: r for r in stores[0].list_runs(limit=1000)}
        running = {i for i, r in records.items() if r.status is RunStatus.RUNNING}
        assert running == set(claims)
        for n, ids in enumerate(won):
            for run_id in ids:
                assert records[run_id].account == f"acct{n}"
                assert stores[0].held_by(run_id) == stores[n].member_id
        held: set[str] = set()
        for run_id in sorted(running):
            record = records[run_id]
            for key in keys(record):
                assert key not in held, f"two running runs share {key}"
                held.add(key)
            for other in records.values():
                if other.status is RunStatus.QUEUED and other.seq < record.seq:
                    assert not set(keys(other)) & set(keys(record)), (other.id, run_id)
        for provider, cap in RULES.provider_caps.items():
            assert sum(1 for i in running if records[i].provider == provider) <= cap
