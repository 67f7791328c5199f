"""A fleet's shared ledger in memory: several simulated members on one queue, in one trio run.

Why this module is long: :class:`SimFleetStore` answers every call of
``FleetStore`` (claims, polls, leases, cancels, usage by member), and the
shared contract tests hold the two to the same answers call by call; the
ledger it connects to lives in :mod:`herdsman.sim.fleet_ledger`.

The PostgreSQL :class:`~herdsman.runtime.store.fleet.FleetStore` is one
member's connection to the fleet's ledger. Here :class:`SimFleet` is the
ledger itself (the database: runs, members and their leases, who holds what,
cancel requests, re-queue marks, and the clock leases are on), and
:class:`SimFleetStore` one member's connection to it, with the same calls and
the same answers: claims with their rules and refusals, polls with cursors,
leases renewed and expired with the fence's margin, ``submit_unless_busy``,
cancel requests, re-queues, usage by member, live conversations. The shared
contract tests (``tests/integration/store/test_fleet_contract.py``) run the
same cases against both.

Why it is right without a lock: the simulator's ledger calls run inline, in
the trio thread, and never await, so no two members' calls interleave —
what the real ledger's fleet lock gives. Each call (and each operation of an
``apply`` batch) is all or nothing, as a transaction: the runs live in a
:class:`MemoryStore`, whose undo log also takes back what a failed call
changed in the fleet's own tables.

A member is killed by cutting its connection off (:meth:`SimFleetStore.cut_off`):
whatever its dying tasks record goes to a copy of the ledger nobody reads, as
a dead process records nothing, and its lease runs on in the real one until
it lapses and another member expires it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import attrs
import outcome

from herdsman.core.accounts import spent_with_estimate
from herdsman.runtime.store.base import Store
from herdsman.runtime.store.errors import LeaseExpired, StoreError
from herdsman.runtime.store.fleet import (
    FENCE_MARGIN,
    AccountBudget,
    ClaimResult,
    ClaimRules,
    FleetView,
    Member,
    Poll,
    Refusal,
    UsageByMember,
    by_member,
    lease_expired_reason,
)
from herdsman.runtime.store.memory import OperationFailed
from herdsman.runtime.store.records import (
    LOST_ON_RESTART,
    AccountLimit,
    AccountUse,
    Attempt,
    NewRun,
    RunEnd,
    RunRecord,
    RunStatus,
    Session,
    budget_charge,
    check_now,
    check_text,
    ended,
    finished,
    needs_before,
    not_found,
    not_queued,
    requeued,
    session_before,
    started,
)
from herdsman.runtime.store.usage import UsageBy, UsageTotal
from herdsman.sim.fleet_ledger import SimFleet

__all__ = ["SimFleet", "SimFleetStore"]

_T = TypeVar("_T")
_RUNNING: Final = RunStatus.RUNNING
_QUEUED: Final = RunStatus.QUEUED


class SimFleetStore:
    """One member's connection to a :class:`SimFleet`: ``FleetStore``'s calls, in memory.

    Every call of :class:`~herdsman.runtime.store.base.Store` and of the
    fleet (:class:`~herdsman.runtime.fleet_ports.FleetLedger`) answers as the
    PostgreSQL ``FleetStore`` does; ``docs/fleet.md`` has the rules.
    """

    def __init__(
        self,
        fleet: SimFleet,
        *,
        member_id: str,
        host: str,
        pid: int,
        lease: float,
        margin: float = FENCE_MARGIN,
    ) -> None:
        """Join ``fleet`` as ``member_id`` with a lease of ``lease`` seconds."""
        if not (math.isfinite(lease) and lease > 0):
            raise StoreError(f"a fleet lease must be a positive number of seconds, got {lease!r}")
        self.fleet = fleet
        self.member_id = member_id
        self.lease = lease
        self.margin = margin
        self.lease_end_local = -math.inf
        self._closed = False
        #: While set, every call fails as over a network cut off from the ledger.
        self.unreachable = False
        sent = fleet.local_clock()
        now = fleet.clock()
        fleet.members[member_id] = Member(member_id, host, pid, now, now + lease)
        self.lease_end_local = sent + lease

    # --- the connection ------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (a member that stops, or dies): every later call is refused."""
        self._closed = True

    def cut_off(self) -> None:
        """The member was killed: what its dying tasks record goes to a copy nobody reads.

        A killed process records nothing more, but its tasks, cancelled,
        may still try (a finish is retried until the ledger takes it): they
        write into a private copy of the ledger as it stood, and give up as
        they would had they succeeded.
        """
        self.fleet = copy.deepcopy(self.fleet)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")
        if self.unreachable:
            raise StoreError(f"member {self.member_id} cannot reach the simulated ledger")

    def _atomic(self, body: Callable[[], _T]) -> _T:
        """Run ``body`` all or nothing, as one transaction (an operation of a batch already is)."""
        self._check_open()
        runs = self.fleet.runs
        if runs.in_operation:
            return body()
        try:
            value: _T = runs.apply_one(lambda _: body())
        except OperationFailed as failed:
            raise failed.error from None
        return value

    def apply(
        self, operations: Sequence[Callable[[Store], Any]], *, durable: bool = False
    ) -> list[outcome.Outcome[Any]]:
        """See :meth:`Store.apply`: each operation is called with this connection."""
        self._check_open()
        return self.fleet.runs.apply([self._as_mine(op) for op in operations], durable=durable)

    def apply_one(self, operation: Callable[[Store], Any]) -> Any:
        """``apply([operation])`` for the simulator's inline ledger, as ``MemoryStore``'s."""
        self._check_open()
        return self.fleet.runs.apply_one(self._as_mine(operation))

    def _as_mine(self, operation: Callable[[Store], Any]) -> Callable[[Store], Any]:
        """``operation`` called with this connection, whatever store the batch hands it."""
        return lambda _: operation(self)

    # --- runs, as any ledger ---------------------------------------------------------

    def submit(self, new: NewRun, now: float) -> tuple[RunRecord, bool]:
        """See :meth:`Store.submit`."""
        self._check_open()
        return self.fleet.runs.submit(new, now)

    def skip(self, new: NewRun, now: float, reason: str) -> tuple[RunRecord, bool]:
        """See :meth:`Store.skip`."""
        self._check_open()
        return self.fleet.runs.skip(new, now, reason)

    def mark_running(self, run_id: str, now: float, account: str | None) -> RunRecord:
        """Refused, as :meth:`mark_running_many`."""
        return self.mark_running_many([(run_id, account)], now)[0]

    def mark_running_many(
        self, items: Sequence[tuple[str, str | None]], now: float
    ) -> list[RunRecord]:
        """Refused: a fleet member starts runs with :meth:`claim_many` only."""
        self._check_open()
        raise StoreError(
            "a fleet member starts runs with claim_many, which checks the fleet's lanes"
        )

    def recover(self, now: float) -> list[RunRecord]:
        """Refused: in a fleet, runs become lost by :meth:`expire_lapsed`, not at a start."""
        self._check_open()
        raise StoreError(
            "a fleet member does not recover runs at start: other members may be running"
            " them; expire_lapsed marks the runs of lapsed members lost"
        )

    def finish(self, run_id: str, end: RunEnd, now: float) -> RunRecord:
        """See :meth:`Store.finish`; a running run only by the member holding it."""

        def body() -> RunRecord:
            checked = check_now(now)
            current = self._existing(run_id)
            before = (
                # With the run's own earlier attempts: a retry resumes its session.
                session_before(
                    self.fleet.runs.records(), current, end, self.fleet.runs.attempts(run_id)
                )
                if end.usage is not None and needs_before(end)
                else None
            )
            record = finished(current, end, checked, before)
            self._update_run(current, record)
            return record

        return self._atomic(body)

    def cancel_queued(self, run_id: str, now: float, reason: str) -> RunRecord:
        """See :meth:`Store.cancel_queued`."""

        def body() -> RunRecord:
            checked = check_now(now)
            current = self._existing(run_id)
            if current.status is not _QUEUED:
                raise not_queued(current)
            record = ended(current, RunStatus.CANCELLED, checked, reason)
            self._update_run(current, record)
            return record

        return self._atomic(body)

    def requeue(
        self, run_id: str, *, failure: str | None = None, retry_at: float | None = None
    ) -> RunRecord:
        """Re-queue a usage_limited run, or record it ``cancelled`` if a cancel was asked.

        As ``FleetStore.requeue``: a cancel asked through another member while
        the holder ran it is carried out here, instead of the re-queue.
        """

        def body() -> RunRecord:
            current = self._existing(run_id)
            asked = self.fleet.cancel_requests.get(run_id)
            if asked is None or current.status is not RunStatus.USAGE_LIMITED:
                record = requeued(current)
                # The member that ran the attempt, as FleetStore keeps it.
                holder = self.fleet.holders.get(run_id)
                self.fleet.runs.keep_attempt(current, failure, retry_at, holder)
            else:
                record = attrs.evolve(current, status=RunStatus.CANCELLED, reason=asked)
            self._update_run(current, record)
            return record

        return self._atomic(body)

    def add_note(self, run_id: str, note: str) -> RunRecord:
        """See :meth:`Store.add_note`."""
        self._check_open()
        return self.fleet.runs.add_note(run_id, note)

    def attempts(self, run_id: str) -> list[Attempt]:
        """See :meth:`Store.attempts`."""
        self._check_open()
        return self.fleet.runs.attempts(run_id)

    def get(self, run_id: str) -> RunRecord | None:
        """See :meth:`Store.get`."""
        self._check_open()
        return self.fleet.runs.get(run_id)

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        provider: str | None = None,
        conversation: str | None = None,
        workspace: str | None = None,
        limit: int = 100,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[RunRecord]:
        """See :meth:`Store.list_runs`."""
        self._check_open()
        return self.fleet.runs.list_runs(
            status=status,
            provider=provider,
            conversation=conversation,
            workspace=workspace,
            limit=limit,
            after_seq=after_seq,
            before_seq=before_seq,
        )

    def queued_in_order(self) -> list[RunRecord]:
        """See :meth:`Store.queued_in_order`."""
        self._check_open()
        return self.fleet.runs.queued_in_order()

    def prune(self, finished_before: float) -> int:
        """See :meth:`Store.prune`; the fleet's columns of a pruned run go with it."""

        def body() -> int:
            fleet = self.fleet
            runs = fleet.runs
            before = {run.id for run in runs.records()}
            count = runs.prune(finished_before)
            if count:
                for run_id in sorted(before - {run.id for run in runs.records()}):
                    for table in (fleet.holders, fleet.cancel_requests, fleet.marks):
                        runs.keep(table, run_id)
                        table.pop(run_id, None)
            return count

        return self._atomic(body)

    def conversation_session(
        self, provider: str, workspace: str, conversation: str
    ) -> Session | None:
        """See :meth:`Store.conversation_session`."""
        self._check_open()
        return self.fleet.runs.conversation_session(provider, workspace, conversation)

    def set_conversation_session(
        self,
        provider: str,
        workspace: str,
        conversation: str,
        session_id: str | None,
        account: str | None = None,
    ) -> None:
        """See :meth:`Store.set_conversation_session`."""
        self._check_open()
        self.fleet.runs.set_conversation_session(
            provider, workspace, conversation, session_id, account
        )

    def sessions(self) -> list[Session]:
        """See :meth:`Store.sessions`."""
        self._check_open()
        return self.fleet.runs.sessions()

    def set_account_limit(
        self, provider: str, account: str | None, until: float, message: str
    ) -> None:
        """See :meth:`Store.set_account_limit`: a rest every member sees."""
        self._check_open()
        self.fleet.runs.set_account_limit(provider, account, until, message)

    def account_limits(self, now: float) -> list[AccountLimit]:
        """See :meth:`Store.account_limits`."""
        self._check_open()
        return self.fleet.runs.account_limits(now)

    def clear_account_limit(self, provider: str, account: str | None) -> None:
        """See :meth:`Store.clear_account_limit`."""
        self._check_open()
        self.fleet.runs.clear_account_limit(provider, account)

    def account_usage(self, since: float) -> list[AccountUse]:
        """See :meth:`Store.account_usage`: every member's runs."""
        self._check_open()
        return self.fleet.runs.account_usage(since)

    def usage(self, by: UsageBy, since: float | None = None) -> list[UsageTotal]:
        """See :meth:`Store.usage`: every member's runs."""
        self._check_open()
        return self.fleet.runs.usage(by, since)

    def counts(self) -> Mapping[RunStatus, int]:
        """See :meth:`Store.counts`."""
        self._check_open()
        return self.fleet.runs.counts()

    # --- leases ----------------------------------------------------------------------

    def renew(self) -> float:
        """Extend the lease by ``lease`` seconds from now; its new end (``FleetStore.renew``)."""
        self._check_open()
        fleet, sent, lease = self.fleet, self.fleet.local_clock(), self.lease
        now = fleet.clock()
        member = fleet.members.get(self.member_id)
        if member is None or member.lease_until < now:
            raise self._expired()
        fleet.runs.keep(fleet.members, self.member_id)
        fleet.members[self.member_id] = attrs.evolve(member, lease_until=now + lease)
        self.lease_end_local = sent + lease
        return now + lease

    def leave(self) -> None:
        """End the lease now, margin waived (``FleetStore.leave``)."""
        self._check_open()
        fleet = self.fleet
        member = fleet.members.get(self.member_id)
        if member is not None:
            fleet.runs.keep(fleet.members, self.member_id)
            fleet.members[self.member_id] = attrs.evolve(
                member, lease_until=fleet.clock() - 1 - FENCE_MARGIN
            )

    def expire_lapsed(self, now: float) -> list[RunRecord]:
        """Remove members whose lease ended over ``margin`` ago; their running runs are lost."""

        def body() -> list[RunRecord]:
            checked = check_now(now)
            self._check_live()
            fleet = self.fleet
            clock = fleet.clock()
            reasons: dict[str, str] = {}
            for member_id in sorted(fleet.members):
                member = fleet.members[member_id]
                if member_id != self.member_id and member.lease_until + self.margin < clock:
                    fleet.runs.keep(fleet.members, member_id)
                    del fleet.members[member_id]
                    reasons[member_id] = lease_expired_reason(member)
            out: list[RunRecord] = []
            for current in fleet.runs.records():
                if current.status is not _RUNNING:
                    continue
                holder = fleet.holders.get(current.id)
                if holder is not None and holder in fleet.members:
                    continue
                reason = LOST_ON_RESTART if holder is None else reasons.get(holder, LOST_ON_RESTART)
                record = ended(current, RunStatus.LOST, checked, reason)
                fleet.write(current, record, held_by=holder)
                out.append(record)
            return out

        return self._atomic(body)

    def members(self) -> list[Member]:
        """Every member still in the ledger (lapsed ones until expired), by id."""
        self._check_open()
        return [self.fleet.members[key] for key in sorted(self.fleet.members)]

    def view(self) -> FleetView:
        """Members, the ledger's clock and running runs per member and provider."""
        members = self.members()
        fleet = self.fleet
        running: dict[tuple[str | None, str], int] = {}
        for run in fleet.runs.records():
            if run.status is _RUNNING:
                key = (fleet.holders.get(run.id), run.provider)
                running[key] = running.get(key, 0) + 1
        return FleetView(fleet.clock(), members, running)

    def held_by(self, run_id: str) -> str | None:
        """The member holding ``run_id`` while it runs, else ``None``."""
        self._check_open()
        run = self.fleet.runs.get(run_id)
        return None if run is None else self.fleet.held(run)

    def running_elsewhere(self) -> list[RunRecord]:
        """Running runs held by other members, by ``seq``."""
        self._check_open()
        fleet = self.fleet
        return [
            run
            for run in fleet.runs.records()
            if run.status is _RUNNING
            and fleet.holders.get(run.id) is not None
            and fleet.holders.get(run.id) != self.member_id
        ]

    def account_usage_by_member(self, since: float) -> UsageByMember:
        """:meth:`account_usage` since ``since``, this member's runs apart from the others'."""
        self._check_open()
        fleet = self.fleet
        since = check_now(since)
        used = [
            run
            for run in fleet.runs.records()
            if run.account is not None
            and run.started_at is not None
            and (
                run.started_at >= since
                or (run.finished_at is not None and run.finished_at >= since)
                or run.status is _RUNNING
            )
            and (run.exit_code is not None or run.status in (_RUNNING, RunStatus.LOST))
        ]
        used.sort(key=lambda run: (run.started_at, run.seq))
        rows: list[tuple[Any, ...]] = []
        for run in used:
            assert run.started_at is not None
            assert run.account is not None
            rows.append(
                (
                    run.provider,
                    run.account,
                    run.started_at,
                    run.started_at if run.status is RunStatus.LOST else run.finished_at,
                    *budget_charge(run.spend),
                    fleet.holders.get(run.id) == self.member_id,
                )
            )
        earlier = sorted(fleet.runs.earlier_usage(since), key=lambda kept: kept[0].started_at)
        return by_member(
            rows,
            ((*use, holder == self.member_id) for use, holder in earlier),
        )

    def live_conversations(self, candidates: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which ``(workspace, conversation)`` of ``candidates`` have a queued or running run."""
        self._check_open()
        return {
            (workspace, conversation)
            for workspace, conversation in candidates
            if self.fleet.live_on_lane(workspace, "conversation", conversation) is not None
        }

    # --- submits, polls and cancels ----------------------------------------------------

    def submit_unless_busy(
        self, new: NewRun, now: float, reason: str, *, agent_exclusive: bool
    ) -> tuple[RunRecord, bool]:
        """Queue ``new``, or record it skipped with ``reason`` if its lanes are busy fleet-wide."""

        def body() -> tuple[RunRecord, bool]:
            checked = check_now(now)
            fleet = self.fleet
            existing = fleet.runs.get(new.id)
            if existing is not None:
                return existing, False
            busy = any(
                fleet.live_on_lane(new.workspace, lane, key) is not None
                for lane, key in _lanes(new.conversation, new.agent, agent_exclusive)
            )
            if busy:
                return fleet.runs.skip(new, checked, reason)
            return fleet.runs.submit(new, checked)

        return self._atomic(body)

    def poll(self, cursor: int, queued: Sequence[str] = ()) -> Poll:
        """Queued runs past ``cursor`` (new or re-queued), cancels asked here, runs that left."""
        self._check_open()
        fleet = self.fleet
        runs: list[RunRecord] = []
        cancels: list[tuple[str, str]] = []
        for run in fleet.runs.records():
            mark = fleet.marks.get(run.id, 0)
            if run.status is _QUEUED and (run.seq > cursor or mark > cursor):
                runs.append(run)
            elif (
                run.status is _RUNNING
                and fleet.holders.get(run.id) == self.member_id
                and run.id in fleet.cancel_requests
            ):
                cancels.append((run.id, fleet.cancel_requests[run.id]))
        moved = cursor
        for run in runs:
            moved = max(moved, run.seq, fleet.marks.get(run.id, 0))
        return Poll(runs, moved, cancels, self._left(queued))

    def left_queue(self, run_ids: Sequence[str]) -> list[str]:
        """Which of ``run_ids`` are not queued in the ledger (or not in it), in the given order."""
        self._check_open()
        return self._left(run_ids)

    def _left(self, run_ids: Sequence[str]) -> list[str]:
        runs = self.fleet.runs
        out = []
        for run_id in run_ids:
            run = runs.get(run_id)
            if run is None or run.status is not _QUEUED:
                out.append(run_id)
        return out

    def request_cancel(self, run_id: str, now: float, reason: str) -> tuple[RunRecord, bool]:
        """Ask the member holding ``run_id`` to cancel it; the run as it stands, cancelled now?"""

        def body() -> tuple[RunRecord, bool]:
            checked = check_now(now)
            check_text(run_id, reason=reason)
            current = self._existing(run_id)
            fleet = self.fleet
            if current.status is _QUEUED:
                record = ended(current, RunStatus.CANCELLED, checked, reason)
                self._update_run(current, record)
                return record, True
            if current.status is _RUNNING and run_id not in fleet.cancel_requests:
                fleet.runs.keep(fleet.cancel_requests, run_id)
                fleet.cancel_requests[run_id] = reason
            return current, False

        return self._atomic(body)

    # --- claims ------------------------------------------------------------------------

    def claim_many(
        self,
        items: Sequence[tuple[str, str | None]],
        now: float,
        rules: ClaimRules | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> ClaimResult:
        """Claim ``(run_id, account)`` pairs in order, each one started or refused."""
        rules = rules if rules is not None else ClaimRules()

        def body() -> ClaimResult:
            at = check_now(now)
            if clock is not None:
                at = check_now(clock())
            self._check_live()
            claimed: list[RunRecord] = []
            refused: list[tuple[str, Refusal]] = []
            for run_id, account in items:
                current = self.fleet.runs.get(run_id) if "\0" not in run_id else None
                if current is None or self._cancel_asked(current, at):
                    refused.append((run_id, Refusal.GONE))
                    continue
                refusal = self._refusal(current, account, rules, at)
                if refusal is not None:
                    refused.append((run_id, refusal))
                    continue
                record = started(current, at, account)
                self._update_run(current, record)
                claimed.append(record)
            self._check_live()
            return ClaimResult(claimed, refused)

        return self._atomic(body)

    # --- internals ---------------------------------------------------------------------

    def _existing(self, run_id: str) -> RunRecord:
        record = self.fleet.runs.get(run_id)
        if record is None:
            raise not_found(run_id)
        return record

    def _update_run(self, current: RunRecord, record: RunRecord) -> None:
        # As FleetStore._update_run: entering running, the run becomes this
        # member's; leaving it, it must be.
        fleet = self.fleet
        involved = _RUNNING in (current.status, record.status)
        fleet.write(current, record, held_by=self.member_id if involved else None)
        if record.status is _QUEUED:  # re-queued: every member's poll must see it
            fleet.runs.keep(fleet.marks, record.id)
            fleet.marks[record.id] = fleet.runs.draw_mark()

    def _cancel_asked(self, run: RunRecord, now: float) -> bool:
        """A queued run someone asked to cancel while it ran: cancel it now; whether so."""
        if run.status is not _QUEUED:
            return False
        asked = self.fleet.cancel_requests.get(run.id)
        if asked is None:
            return False
        self.fleet.write(run, ended(run, RunStatus.CANCELLED, now, asked), held_by=None)
        return True

    def _refusal(
        self, run: RunRecord, account: str | None, rules: ClaimRules, now: float
    ) -> Refusal | None:
        fleet = self.fleet
        if run.status is not _QUEUED:
            return Refusal.GONE
        found: set[RunStatus] = set()
        for lane, key in _lanes(run.conversation, run.agent, rules.agent_exclusive):
            status = fleet.live_on_lane(run.workspace, lane, key, before=run.seq)
            if status is not None:
                found.add(status)
        if _RUNNING in found:
            return Refusal.LANE_BUSY
        if found:
            return Refusal.EARLIER_QUEUED
        cap = rules.provider_caps.get(run.provider)
        if cap is not None and fleet.running_count(run.provider, of_account=False) >= cap:
            return Refusal.PROVIDER_CAP
        if account is not None:
            cap = rules.account_caps.get((run.provider, account))
            if (
                cap is not None
                and fleet.running_count(run.provider, account, of_account=True) >= cap
            ):
                return Refusal.ACCOUNT_CAP
        if any(
            limit.provider == run.provider and limit.account == account
            for limit in fleet.runs.account_limits(now)
        ):
            return Refusal.ACCOUNT_RESTING
        budget = None if account is None else rules.account_budgets.get((run.provider, account))
        if budget is not None and self._usage(run.provider, account, budget, now) >= budget.budget:
            return Refusal.ACCOUNT_BUDGET
        return None

    def _usage(
        self, provider: str, account: str | None, budget: AccountBudget, now: float
    ) -> float:
        """The account's usage in its window at ``now``, in ``budget.unit``, every member's runs."""
        horizon = now - budget.window
        if budget.unit in ("tokens", "usd"):
            return self._spent(provider, account, budget, now)
        total = 0.0
        for run in self.fleet.runs.records():
            if run.provider != provider or run.account != account or run.started_at is None:
                continue
            if budget.unit == "runs":
                if run.started_at > horizon and (
                    run.exit_code is not None or run.status in (_RUNNING, RunStatus.LOST)
                ):
                    total += 1
            elif run.status is _RUNNING:
                total += (now - max(run.started_at, horizon)) / 60.0
            elif (
                run.finished_at is not None
                and run.finished_at > horizon
                and run.exit_code is not None
                and run.status is not RunStatus.LOST
            ):
                total += max(0.0, run.finished_at - run.started_at) / 60.0
        for attempt in self._earlier(provider, account):
            assert attempt.started_at is not None
            if budget.unit == "runs":
                if attempt.started_at > horizon:
                    total += 1
            elif (
                attempt.finished_at is not None
                and attempt.finished_at > horizon
                and attempt.status is not RunStatus.LOST
            ):
                total += max(0.0, attempt.finished_at - attempt.started_at) / 60.0
        return total

    def _earlier(self, provider: str, account: str | None) -> list[Attempt]:
        """Earlier attempts on the account that count, as ``fleet_checks`` counts them.

        Each ended: with a process, or moved off its account (``failure`` None).
        """
        runs = self.fleet.runs
        return [
            attempt
            for run in runs.records()
            if run.provider == provider
            for attempt in runs.attempts(run.id)
            if attempt.account == account
            and attempt.started_at is not None
            and (attempt.exit_code is not None or attempt.failure is None)
        ]

    def _spent(
        self, provider: str, account: str | None, budget: AccountBudget, now: float
    ) -> float:
        """:meth:`_usage` in tokens or dollars: ended runs' spend, running ones at its mean."""
        horizon = now - budget.window
        total, stated, running = 0.0, 0, 0
        for run in self.fleet.runs.records():
            if run.provider != provider or run.account != account or run.started_at is None:
                continue
            if run.status is _RUNNING:
                running += 1
            elif (
                run.finished_at is not None
                and run.finished_at > horizon
                and run.exit_code is not None
                and run.status is not RunStatus.LOST
            ):
                tokens, usd = budget_charge(run.spend)
                amount = tokens if budget.unit == "tokens" else usd
                if amount is not None:
                    total += amount
                    stated += 1
        for attempt in self._earlier(provider, account):
            if (
                attempt.failure is not None  # one moved off its account is charged no spend
                and attempt.finished_at is not None
                and attempt.finished_at > horizon
                and attempt.status is not RunStatus.LOST
            ):
                tokens, usd = budget_charge(attempt.spend)
                amount = tokens if budget.unit == "tokens" else usd
                if amount is not None:
                    total += amount
                    stated += 1
        return spent_with_estimate(total, stated, running)

    def _check_live(self) -> None:
        member = self.fleet.members.get(self.member_id)
        if member is None or member.lease_until < self.fleet.clock():
            raise self._expired()

    def _expired(self) -> LeaseExpired:
        return LeaseExpired(
            f"the fleet lease of this supervisor ({self.member_id}) on the simulated ledger"
            " has expired: other members may have declared its running runs lost; it starts"
            " nothing more"
        )


def _lanes(
    conversation: str | None, agent: str | None, agent_exclusive: bool
) -> list[tuple[str, str]]:
    """A run's lanes checked fleet-wide, as ``(field, key)``: its conversation, its agent."""
    lanes = [("conversation", conversation)]
    if agent_exclusive:
        lanes.append(("agent", agent))
    return [(lane, key) for lane, key in lanes if key is not None]
