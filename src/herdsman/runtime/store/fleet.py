"""Fleet coordination in a PostgreSQL ledger: members, leases and atomic claims.

Several supervisors share one queue when each opens the ledger as a
:class:`FleetStore`. Each is a *member* (a row of ``supervisors``, a random
id per process start) holding a *lease* it renews. Starting a run is a
*claim*: one transaction that re-checks, fleet-wide, everything the local
scheduler decided on its own view (the run is still queued, its lanes are
free, no earlier queued run waits on them, the fleet-wide caps have room)
and records the run as running and held by the member, or refuses it and
changes nothing. A member whose lease lapsed is *expired* by any live one:
in one transaction its row goes and its running runs become ``lost``, never
re-run, once a margin has passed for the member's fence to kill its agents
(fence_keeper.py). The rules are those of docs/scheduling.md; docs/fleet.md
says how they map onto these transactions.

Claims and expiries serialise on one transaction-scoped advisory lock (the
*fleet lock*): simple, obviously correct, and fast enough for a queue of
agent runs (``benchmarks/fleet.py`` measures it). Lease times are the
database server's clock, the one clock every member shares; a member's own
clock may be off by more than a short lease.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import attrs

from herdsman.runtime.fence_keeper import fence_clock
from herdsman.runtime.store.errors import LeaseExpired, StoreError
from herdsman.runtime.store.fleet_checks import (
    cancel_if_asked,
    cancel_reason,
    claim_refusal,
    fleet_lanes,
    ids_not_queued,
    live_on_lane,
    write_held,
)
from herdsman.runtime.store.fleet_values import (
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
from herdsman.runtime.store.postgres import SOLE_SUPERVISOR_LOCK, PostgresStore
from herdsman.runtime.store.queries import (
    ACCOUNT_USAGE_EARLIER_COLUMNS,
    ACCOUNT_USAGE_EARLIER_FROM,
    ACCOUNT_USAGE_WHERE,
    CHARGED,
    CHARGED_END,
    INSERT_ATTEMPT,
    RUN_COLUMNS,
    SELECT_RUNS,
    Cursor,
    attempt_values,
    existing_run,
    fetch_run,
    insert_new,
    run_from_row,
)
from herdsman.runtime.store.records import (
    LOST_ON_RESTART,
    NewRun,
    RunRecord,
    RunStatus,
    attempt_of,
    check_now,
    check_text,
    ended,
    requeued,
    started,
)

__all__ = [
    "FENCE_MARGIN",
    "AccountBudget",
    "ClaimResult",
    "ClaimRules",
    "FleetStore",
    "FleetView",
    "LeaseExpired",
    "Member",
    "Poll",
    "Refusal",
    "UsageByMember",
    "by_member",
    "lease_expired_reason",
]

# Serialises claims and expiries fleet-wide (pg_advisory_xact_lock: released
# at commit or rollback, however the transaction ends). With the schema's
# oid in the low 32 bits, as the sole-supervisor lock: a schema is a ledger,
# and two ledgers in one database must not wait for each other. "hrdf".
_FLEET_LOCK = 0x68726466
# The server's clock in unix seconds, read at the moment of the statement
# (now() would be the transaction's start, before any lock wait).
_CLOCK = "extract(epoch FROM clock_timestamp())::double precision"
# seq's own counter: a re-queued run's mark and a new run's seq are drawn,
# under the fleet lock, from one increasing series, so one poll cursor
# covers both (see FleetStore.poll).
_NEXT_MARK = "nextval(pg_get_serial_sequence('runs', 'seq'))"
#: The member a run's row names as its holder (kept after the run ends).
_HOLDER = "SELECT held_by FROM runs WHERE id = ?"


class FleetStore(PostgresStore):
    """A PostgreSQL ledger shared by several supervisors, this one a member.

    Opening joins the fleet: the member row is written with a lease of
    ``lease`` seconds, renewed by :meth:`renew`. Starts go through
    :meth:`claim_many` (not ``mark_running_many``), and :meth:`finish`
    refuses to record the outcome of a running run this member does not
    hold — in particular one already declared ``lost`` after its lease
    lapsed. A supervisor holding the ledger alone (``sole``) and a fleet
    exclude each other.
    """

    def __init__(
        self,
        url: str,
        *,
        member_id: str,
        host: str,
        pid: int,
        lease: float,
        connect_timeout: int = 10,
        margin: float = FENCE_MARGIN,
    ) -> None:
        """Connect, create or migrate the schema, and join the fleet as ``member_id``.

        ``margin``: how long after a member's lease ended this member waits
        before it expires it (:data:`FENCE_MARGIN`).
        """
        if not (math.isfinite(lease) and lease > 0):
            raise StoreError(f"a fleet lease must be a positive number of seconds, got {lease!r}")
        self.margin = margin
        #: Until when, on :func:`fence_clock`, the lease certainly holds by
        #: the server's clock too: read before the statement that set the
        #: lease, plus the lease (the server's clock_timestamp() was read
        #: after it). Set when the statement has run: it holds once its
        #: transaction commits (in a batch, the batch's). ``-inf`` until joined.
        self.lease_end_local = -math.inf
        # Set by _take_ledger; until then (never, if joining fails) no lock.
        self._fleet_lock: int | None = None
        super().__init__(url, connect_timeout=connect_timeout, sole=False)
        self.member_id = member_id
        self.lease = lease
        try:
            self._join(host, pid)
        except BaseException:
            self.close()
            raise

    def _take_ledger(self, sole: bool) -> None:
        """Hold the sole-supervisor lock in shared mode: no sole supervisor while a member runs.

        Taken, like the sole supervisor's, before the schema is read or
        migrated: a member refused here has changed nothing.
        """
        with self._reading() as cur:
            row = cur.execute(
                "SELECT pg_try_advisory_lock_shared((?::bigint << 32) | oid::bigint), oid"
                " FROM pg_namespace WHERE nspname = current_schema()",
                (SOLE_SUPERVISOR_LOCK,),
            ).fetchone()
        if row is None or not row[0]:
            raise StoreError(
                f"a herdsman supervisor that is not a fleet member holds the run ledger on"
                f" {self.server}: a fleet cannot share it; stop that supervisor first"
            )
        self._fleet_lock = (_FLEET_LOCK << 32) | int(row[1])

    def _join(self, host: str, pid: int) -> None:
        sent = fence_clock()
        with self._transaction() as cur:
            cur.execute(
                "INSERT INTO supervisors (id, host, pid, joined_at, lease_until)"
                f" VALUES (?, ?, ?, {_CLOCK}, {_CLOCK} + ?)",
                (self.member_id, host, pid, self.lease),
            )
        self.lease_end_local = sent + self.lease

    # --- leases ----------------------------------------------------------------

    def renew(self) -> float:
        """Extend this member's lease by ``lease`` seconds from now; return its new end.

        Raises :class:`LeaseExpired` if the lease had already lapsed (whether
        or not another member has expired it yet): a lapsed lease is never
        revived, since another member may be declaring its runs lost.
        Moves :attr:`lease_end_local` on.
        """
        sent, lease = fence_clock(), self.lease
        with self._transaction() as cur:
            row = cur.execute(
                f"UPDATE supervisors SET lease_until = {_CLOCK} + ?"
                f" WHERE id = ? AND lease_until >= {_CLOCK} RETURNING lease_until",
                (lease, self.member_id),
            ).fetchone()
        if row is None:
            raise self._expired()
        self.lease_end_local = sent + lease
        return float(row[0])

    def leave(self) -> None:
        """End this member's lease now (a clean shutdown); the next expiry removes it.

        Runs it still holds then become ``lost`` like those of any expired
        member. The margin is waived: call this once this member's agents
        are gone (its fence closed).
        """
        with self._transaction() as cur:
            cur.execute(
                f"UPDATE supervisors SET lease_until = {_CLOCK} - 1 - ? WHERE id = ?",
                (FENCE_MARGIN, self.member_id),
            )

    def expire_lapsed(self, now: float) -> list[RunRecord]:
        """Remove every member whose lease ended over ``margin`` ago; its running runs become lost.

        The margin gives the member's fence keeper time to kill its agents
        (docs/fleet.md): none of them still runs once its runs are lost.
        One transaction, under the fleet lock: a member's row goes together
        with marking its runs lost, so a running run's holder is always a
        member. Returns the runs marked lost, by ``seq``. Only a live member
        may do this (:class:`LeaseExpired` otherwise).
        """
        out: list[RunRecord] = []
        with self._transaction() as cur:
            now = check_now(now)
            self._check_live(cur)
            # The lease is re-checked row by row as each is deleted, so a
            # renewal that committed meanwhile keeps its member.
            gone = [
                Member(*row)
                for row in cur.execute(
                    "DELETE FROM supervisors"
                    f" WHERE lease_until + ? < {_CLOCK} AND id <> ?"
                    " RETURNING id, host, pid, joined_at, lease_until",
                    (self.margin, self.member_id),
                ).fetchall()
            ]
            reasons = {member.id: lease_expired_reason(member) for member in gone}
            # Every running run whose holder is no member: the expired ones',
            # and any left by a supervisor that held the ledger alone (held_by
            # NULL) and died, or by a member removed without its runs.
            rows = cur.execute(
                f"SELECT {RUN_COLUMNS}, held_by FROM runs WHERE status = ? AND (held_by IS NULL"
                " OR held_by NOT IN (SELECT id FROM supervisors)) ORDER BY seq",
                (RunStatus.RUNNING.value,),
            ).fetchall()
            for *columns, holder in rows:
                current = run_from_row(tuple(columns))
                reason = reasons.get(holder, LOST_ON_RESTART)
                record = ended(current, RunStatus.LOST, now, reason)
                write_held(cur, current, record, held_by=holder)
                out.append(record)
        return sorted(out, key=lambda r: r.seq)

    def members(self) -> list[Member]:
        """Every member still in the ledger (lapsed ones until expired), by id."""
        with self._reading() as cur:
            rows = cur.execute(
                "SELECT id, host, pid, joined_at, lease_until FROM supervisors ORDER BY id"
            ).fetchall()
        return [Member(*row) for row in rows]

    def view(self) -> FleetView:
        """Members, the server's clock and running runs per member and provider: three reads."""
        members = self.members()
        with self._reading() as cur:
            row = cur.execute(f"SELECT {_CLOCK}").fetchone()
            counts = cur.execute(
                "SELECT held_by, provider, count(*) FROM runs WHERE status = ?"
                " GROUP BY held_by, provider",
                (RunStatus.RUNNING.value,),
            ).fetchall()
        running = {(holder, provider): int(count) for holder, provider, count in counts}
        return FleetView(float(row[0]), members, running)

    def held_by(self, run_id: str) -> str | None:
        """The member holding ``run_id`` while it runs, else ``None``."""
        with self._reading() as cur:
            row = cur.execute(
                "SELECT held_by FROM runs WHERE id = ? AND status = ?",
                (run_id, RunStatus.RUNNING.value),
            ).fetchone()
        return None if row is None else row[0]

    def running_elsewhere(self) -> list[RunRecord]:
        """Running runs held by other members, by ``seq``: their lanes are busy."""
        with self._reading() as cur:
            rows = cur.execute(
                f"{SELECT_RUNS} WHERE status = ? AND held_by <> ? ORDER BY seq",
                (RunStatus.RUNNING.value, self.member_id),
            ).fetchall()
        return [run_from_row(row) for row in rows]

    def account_usage_by_member(self, since: float) -> UsageByMember:
        """:meth:`account_usage` since ``since``, split into this member's runs and the others'.

        What every member needs to count an account's window fleet-wide
        without counting its own runs twice: those it counts as they start
        and end. A lost run is charged no run-minutes, as in :meth:`account_usage`.
        An earlier attempt of a re-queued or retried run is on the side of
        the member that ran it (``run_attempts.held_by``), whoever holds the
        run now; one kept before the column existed, on the others' side.
        """
        running, lost = RunStatus.RUNNING.value, RunStatus.LOST.value
        with self._reading() as cur:
            since = check_now(since)
            rows = cur.execute(
                "SELECT provider, account, started_at,"
                + CHARGED_END
                + CHARGED
                + ", coalesce(held_by = ?, false) FROM runs"
                + ACCOUNT_USAGE_WHERE
                + " ORDER BY started_at, seq",
                (lost, self.member_id, since, since, running, running, lost),
            ).fetchall()
            # Earlier attempts, each under the member that ran it (run_attempts.held_by).
            earlier = cur.execute(
                "SELECT "
                + ACCOUNT_USAGE_EARLIER_COLUMNS
                + ", coalesce(a.held_by = ?, false)"
                + ACCOUNT_USAGE_EARLIER_FROM,
                (lost, self.member_id, since, since, lost),
            ).fetchall()
        return by_member(rows, earlier)

    def live_conversations(self, candidates: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which ``(workspace, conversation)`` of ``candidates`` have a queued or running run.

        Anywhere in the fleet: a probe per candidate on the live-lane index.
        """
        with self._reading() as cur:
            return {
                (workspace, conversation)
                for workspace, conversation in candidates
                if live_on_lane(cur, workspace, "conversation", conversation) is not None
            }

    # --- submits ---------------------------------------------------------------

    def submit_unless_busy(
        self, new: NewRun, now: float, reason: str, *, agent_exclusive: bool
    ) -> tuple[RunRecord, bool]:
        """Queue ``new``, or record it skipped with ``reason`` if its lanes are busy fleet-wide.

        ``on_busy = "skip"`` in a fleet: busy means a queued or running run,
        anywhere in the fleet, shares its conversation key or, with
        ``agent_exclusive``, its agent key — the rule of the local scheduler's
        ``is_busy``. Decided under the fleet lock, in the transaction that
        records the run, so no submit to another member can slip in between.
        An existing id returns the existing run, as :meth:`submit` does.
        """
        with self._transaction() as cur:
            now = check_now(now)
            existing = fetch_run(cur, new.id)
            if existing is not None:
                return existing, False
            busy = any(
                live_on_lane(cur, new.workspace, column, key) is not None
                for column, key in fleet_lanes(new.conversation, new.agent, agent_exclusive)
            )
            if busy:
                return insert_new(cur, new, now, RunStatus.SKIPPED, reason)
            return insert_new(cur, new, now, RunStatus.QUEUED, None)

    def poll(self, cursor: int, queued: Sequence[str] = ()) -> Poll:
        """What a member reads every poll: see :class:`Poll`.

        ``queued``: the runs the member holds queued in its own scheduler;
        those the ledger no longer has queued come back as :attr:`Poll.left`,
        so the member stops holding their lanes (:meth:`left_queue`).

        A run re-queued by a member (a usage limit) keeps its ``seq``, its
        place in the queue, which other members' cursors have passed; so a
        re-queue also draws a ``requeue_mark`` from ``seq``'s counter, and a
        poll reads the queued runs whose ``seq`` or mark is past the cursor.
        Both are drawn under the fleet lock (a submit takes it before drawing
        its ``seq``), so none lower than one already read can commit later:
        polling with the returned cursor misses nothing.
        """
        with self._reading() as cur:
            rows = cur.execute(
                f"SELECT {RUN_COLUMNS}, requeue_mark FROM runs WHERE status = ?"
                " AND (seq > ? OR requeue_mark > ?) ORDER BY seq",
                (RunStatus.QUEUED.value, cursor, cursor),
            ).fetchall()
            cancels = cur.execute(
                "SELECT id, cancel_request FROM runs WHERE status = ? AND held_by = ?"
                " AND cancel_request IS NOT NULL ORDER BY seq",
                (RunStatus.RUNNING.value, self.member_id),
            ).fetchall()
            left = ids_not_queued(cur, queued)
        runs = []
        for *columns, mark in rows:
            record = run_from_row(tuple(columns))
            runs.append(record)
            cursor = max(cursor, record.seq, mark or 0)
        return Poll(runs, cursor, [(run_id, reason) for run_id, reason in cancels], left)

    def left_queue(self, run_ids: Sequence[str]) -> list[str]:
        """Which of ``run_ids`` are not queued in the ledger (or not in it), in the given order."""
        with self._reading() as cur:
            return ids_not_queued(cur, run_ids)

    def request_cancel(self, run_id: str, now: float, reason: str) -> tuple[RunRecord, bool]:
        """Ask the member holding ``run_id`` to cancel it; the run as it stands, cancelled now?

        A running run keeps running: its holder sees the request at its next
        poll (:attr:`Poll.cancels`), stops its process and records it
        ``cancelled`` with ``reason`` (the first reason asked for, if asked
        twice). A run queued again meanwhile is cancelled at once; an ended
        one is returned as it is. If the holder's lease lapses first, the run
        becomes ``lost`` and the request is moot.
        """
        with self._transaction() as cur:
            now = check_now(now)
            check_text(run_id, reason=reason)
            current = existing_run(cur, run_id)
            if current.status is RunStatus.QUEUED:
                record = ended(current, RunStatus.CANCELLED, now, reason)
                self._update_run(cur, current, record)
                return record, True
            if current.status is RunStatus.RUNNING:
                cur.execute(
                    "UPDATE runs SET cancel_request = coalesce(cancel_request, ?)"
                    " WHERE id = ? AND status = ?",
                    (reason, run_id, RunStatus.RUNNING.value),
                )
            return current, False

    # --- claims ----------------------------------------------------------------

    def claim_many(
        self,
        items: Sequence[tuple[str, str | None]],
        now: float,
        rules: ClaimRules | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> ClaimResult:
        """Claim ``(run_id, account)`` pairs in order: each one started, or refused.

        One durable transaction under the fleet lock. An item is claimed only
        if the run is queued, no running run shares its conversation (or,
        with ``rules.agent_exclusive``, agent) key, no queued run submitted
        before it shares one, the fleet-wide caps of ``rules`` have room, its
        account does not rest and has budget left at ``now``; items see the
        claims of the items before them. A refused item
        changes nothing. Raises :class:`LeaseExpired`, claiming nothing, if
        this member's lease has lapsed. An id the ledger does not hold (pruned
        after it ended, say) is refused as ``gone``: nothing starts.

        With a ``clock``, the claimed runs' ``started_at`` is read from it
        once the fleet lock is held, instead of ``now``: a run then never
        appears started before the finish of the run it waited for (on a
        machine whose clock agrees), since that finish committed before the
        lock was granted.
        """
        rules = rules if rules is not None else ClaimRules()
        claimed: list[RunRecord] = []
        refused: list[tuple[str, Refusal]] = []
        with self._transaction(durable=True) as cur:
            now = check_now(now)
            if clock is not None:
                now = check_now(clock())
            self._check_live(cur)
            for run_id, account in items:
                current = fetch_run(cur, run_id)
                if current is None or cancel_if_asked(cur, current, now):
                    refused.append((run_id, Refusal.GONE))
                    continue
                refusal = claim_refusal(cur, current, account, rules, now)
                if refusal is not None:
                    refused.append((run_id, refusal))
                    continue
                record = started(current, now, account)
                self._update_run(cur, current, record)
                claimed.append(record)
            # Again at the end: the claims commit only if the lease outlived
            # the transaction, so no member spawns a run already due to be lost.
            self._check_live(cur)
        return ClaimResult(claimed, refused)

    def requeue(
        self, run_id: str, *, failure: str | None = None, retry_at: float | None = None
    ) -> RunRecord:
        """Re-queue a usage_limited run, or record it ``cancelled`` if a cancel was asked.

        A cancel asked through another member while the holder ran the run
        (``cancel_request``) is carried out here, in the re-queue's own
        transaction: the run ends ``cancelled`` with the reason asked, its
        attempt's outcome kept, instead of going back to the queue, where no
        member might offer it for as long as its account rests, holding its
        lanes fleet-wide. The caller tells the two apart by the status.
        """
        with self._transaction() as cur:
            current = existing_run(cur, run_id)
            asked = cancel_reason(cur, run_id)
            if asked is None or current.status is not RunStatus.USAGE_LIMITED:
                record = requeued(current)
                # The attempt keeps the member that ran it (the row's holder,
                # kept past its end): a restart then tells its own from others'.
                (holder,) = cur.execute(_HOLDER, (run_id,)).fetchone()
                attempt = attempt_of(current, failure, retry_at, holder)
                cur.execute(INSERT_ATTEMPT, attempt_values(attempt))
            else:
                record = attrs.evolve(current, status=RunStatus.CANCELLED, reason=asked)
            self._update_run(cur, current, record)
            return record

    def mark_running_many(
        self, items: Sequence[tuple[str, str | None]], now: float
    ) -> list[RunRecord]:
        """Refused: a fleet member starts runs with :meth:`claim_many` only."""
        raise StoreError(
            "a fleet member starts runs with claim_many, which checks the fleet's lanes"
        )

    def recover(self, now: float) -> list[RunRecord]:
        """Refused: in a fleet, runs become lost by :meth:`expire_lapsed`, not at a start."""
        raise StoreError(
            "a fleet member does not recover runs at start: other members may be running"
            " them; expire_lapsed marks the runs of lapsed members lost"
        )

    # --- internals -------------------------------------------------------------

    def _update_run(self, cur: Cursor, current: RunRecord, record: RunRecord) -> None:
        # Every change of a run goes through here (finish, cancel, requeue):
        # entering running, it becomes this member's; leaving it, it must be.
        involved = RunStatus.RUNNING in (current.status, record.status)
        write_held(cur, current, record, held_by=self.member_id if involved else None)
        if record.status is RunStatus.QUEUED:  # re-queued: every member's poll must see it
            cur.execute(f"UPDATE runs SET requeue_mark = {_NEXT_MARK} WHERE id = ?", (record.id,))

    @contextmanager
    def _transaction(self, *, durable: bool = False, batch: bool = False) -> Iterator[Cursor]:
        # Every write of every member (each write operation of a batch too)
        # takes the fleet lock before it reads or changes anything, so
        # members' writes never interleave:
        # - what a claim or an expiry reads stays true until it commits (a
        #   cancel or a finish cannot slip in between and fail the batch);
        # - seq order is commit order, so a claim that sees no earlier queued
        #   run on its lanes can never see one appear later;
        # - rows are only locked by writes, under the fleet lock: one lock
        #   order, so writers never deadlock.
        # Reads (a poll, a batch of reads) take no lock: a batch's own
        # transaction does not, its writing operations do. The lock is
        # re-entrant within a transaction; an operation of a batch that fails
        # releases it with its savepoint, along with everything it changed.
        with super()._transaction(durable=durable, batch=batch) as cur:
            if self._fleet_lock is not None and not batch:
                cur.execute("SELECT pg_advisory_xact_lock(?)", (self._fleet_lock,))
            yield cur

    def _check_live(self, cur: Cursor) -> None:
        row = cur.execute(
            f"SELECT lease_until >= {_CLOCK} FROM supervisors WHERE id = ?", (self.member_id,)
        ).fetchone()
        if row is None or not row[0]:
            raise self._expired()

    def _expired(self) -> LeaseExpired:
        return LeaseExpired(
            f"the fleet lease of this supervisor ({self.member_id}) on {self.server} has"
            " expired: other members may have declared its running runs lost; it starts"
            " nothing more"
        )
