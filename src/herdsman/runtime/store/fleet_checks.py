"""A fleet claim's checks in SQL, under the fleet lock: lanes, caps, rests, budgets, cancels.

:class:`~herdsman.runtime.store.fleet.FleetStore` calls these inside its
transactions; each reads (or, :func:`write_held`, updates) the shared ``runs``
table as docs/fleet.md says a claim does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from herdsman.core.accounts import spent_with_estimate
from herdsman.runtime.store.fleet_values import AccountBudget, ClaimRules, Refusal
from herdsman.runtime.store.queries import (
    BUDGET_TOKENS,
    Cursor,
    check_updated,
    life_values,
    limit_key,
    update_life,
)
from herdsman.runtime.store.records import RunRecord, RunStatus, ended

__all__ = [
    "cancel_if_asked",
    "cancel_reason",
    "claim_refusal",
    "fleet_lanes",
    "ids_not_queued",
    "live_on_lane",
    "write_held",
]

_UPDATE = update_life()
_UPDATE_HELD = update_life("held_by")


def claim_refusal(
    cur: Cursor, run: RunRecord, account: str | None, rules: ClaimRules, now: float
) -> Refusal | None:
    """Why ``run`` may not be claimed at ``now``, or ``None`` if it may."""
    if run.status is not RunStatus.QUEUED:
        return Refusal.GONE
    found: set[str] = set()
    for column, key in fleet_lanes(run.conversation, run.agent, rules.agent_exclusive):
        status = live_on_lane(cur, run.workspace, column, key, before=run.seq)
        if status is not None:
            found.add(status)
    if RunStatus.RUNNING.value in found:
        return Refusal.LANE_BUSY
    if found:
        return Refusal.EARLIER_QUEUED
    cap = rules.provider_caps.get(run.provider)
    if cap is not None and _running(cur, "provider = ?", (run.provider,)) >= cap:
        return Refusal.PROVIDER_CAP
    if account is not None:
        cap = rules.account_caps.get((run.provider, account))
        if (
            cap is not None
            and _running(cur, "provider = ? AND account = ?", (run.provider, account)) >= cap
        ):
            return Refusal.ACCOUNT_CAP
    return _account_refusal(cur, run.provider, account, rules, now)


def _account_refusal(
    cur: Cursor, provider: str, account: str | None, rules: ClaimRules, now: float
) -> Refusal | None:
    """Whether the account rests, or its budget is spent fleet-wide, at ``now``."""
    resting = cur.execute(
        "SELECT 1 FROM account_limits WHERE provider = ? AND account = ? AND until > ?",
        (provider, limit_key(account), now),
    ).fetchone()
    if resting is not None:
        return Refusal.ACCOUNT_RESTING
    budget = None if account is None else rules.account_budgets.get((provider, account))
    if budget is not None and _usage(cur, provider, account, budget, now) >= budget.budget:
        return Refusal.ACCOUNT_BUDGET
    return None


def fleet_lanes(
    conversation: str | None, agent: str | None, agent_exclusive: bool
) -> list[tuple[str, str]]:
    """A run's lanes checked fleet-wide, as ``(column, key)``: its conversation, its agent."""
    lanes = [("conversation", conversation)]
    if agent_exclusive:
        lanes.append(("agent", agent))
    return [(column, key) for column, key in lanes if key is not None]


def live_on_lane(
    cur: Cursor, workspace: str, column: str, key: str, *, before: int | None = None
) -> str | None:
    """``running`` if a run runs on the lane, else ``queued`` if one waits on it, else ``None``.

    With ``before``, only queued runs submitted before that ``seq`` count.
    """
    # The live-lane partial indexes (migration 5) answer this in a probe per
    # lane: only the lane's queued and running runs are read. 'running'
    # sorts after 'queued': a running one is found first.
    earlier = "" if before is None else " AND (status = 'running' OR seq < ?)"
    params = (workspace, key) if before is None else (workspace, key, before)
    row = cur.execute(
        "SELECT status FROM runs WHERE status IN ('queued', 'running')"
        f" AND workspace = ? AND {column} = ?{earlier} ORDER BY status DESC LIMIT 1",
        params,
    ).fetchone()
    return None if row is None else str(row[0])


def _usage(
    cur: Cursor, provider: str, account: str | None, budget: AccountBudget, now: float
) -> float:
    """The account's usage in its window at ``now``, in ``budget.unit``, every member's runs."""
    horizon = now - budget.window
    running, lost = RunStatus.RUNNING.value, RunStatus.LOST.value
    # Earlier attempts (run_attempts) count as runs of their own, under their
    # own account, as in account_usage: ended, with a process or moved off
    # their account (failure NULL), which is then charged no spend.
    earlier = (
        " FROM run_attempts a JOIN runs r ON r.id = a.run_id"
        " WHERE r.provider = ? AND a.account = ? AND a.started_at IS NOT NULL"
        " AND (a.exit_code IS NOT NULL OR a.failure IS NULL)"
    )
    if budget.unit in ("tokens", "usd"):
        spent = BUDGET_TOKENS if budget.unit == "tokens" else "cost_usd"
        ended = f"CASE WHEN status <> ? THEN {spent} END"
        row = cur.execute(
            f"SELECT coalesce(sum({ended}), 0), count({ended}),"
            " count(CASE WHEN status = ? THEN 1 END) FROM runs"
            " WHERE provider = ? AND account = ? AND started_at IS NOT NULL"
            # As for run-minutes: charged when they end, if they got a process.
            " AND (status = ? OR (finished_at > ? AND exit_code IS NOT NULL AND status <> ?))",
            (running, running, running, provider, account, running, horizon, lost),
        ).fetchone()
        charged = " + ".join("a." + column for column in spent.split(" + "))
        moved = f"CASE WHEN a.failure IS NOT NULL THEN {charged} END"
        before = cur.execute(
            f"SELECT coalesce(sum({moved}), 0), count({moved})"
            + earlier
            + " AND a.finished_at > ? AND a.status <> ?",
            (provider, account, horizon, lost),
        ).fetchone()
        return spent_with_estimate(
            float(row[0]) + float(before[0]), int(row[1]) + int(before[1]), int(row[2])
        )
    if budget.unit == "runs":
        row = cur.execute(
            "SELECT count(*) FROM runs WHERE started_at > ? AND provider = ? AND account = ?"
            # A run that never got a process spent nothing (as account_usage).
            " AND (exit_code IS NOT NULL OR status IN (?, ?))",
            (horizon, provider, account, running, lost),
        ).fetchone()
        before = cur.execute(
            "SELECT count(*)" + earlier + " AND a.started_at > ?", (provider, account, horizon)
        ).fetchone()
        return float(row[0]) + float(before[0])
    row = cur.execute(
        "SELECT coalesce(sum(CASE WHEN status = ? THEN ? - greatest(started_at, ?)"
        " ELSE greatest(0, finished_at - started_at) END), 0) FROM runs"
        " WHERE provider = ? AND account = ? AND started_at IS NOT NULL"
        # Charged when they end, and only if they got a process; a lost one never.
        " AND (status = ? OR (finished_at > ? AND exit_code IS NOT NULL AND status <> ?))",
        (running, now, horizon, provider, account, running, horizon, lost),
    ).fetchone()
    before = cur.execute(
        "SELECT coalesce(sum(greatest(0, a.finished_at - a.started_at)), 0)"
        + earlier
        + " AND a.finished_at > ? AND a.status <> ?",
        (provider, account, horizon, lost),
    ).fetchone()
    return (float(row[0]) + float(before[0])) / 60.0


def cancel_if_asked(cur: Cursor, run: RunRecord, now: float) -> bool:
    """Cancel a queued run someone asked to cancel while it ran; whether it was asked.

    A cancel can be asked of a run's holder just as the holder re-queues it
    after a usage limit: the request then outlives the run's holding, and is
    carried out by the first claim of it, whoever claims it.
    """
    if run.status is not RunStatus.QUEUED:
        return False
    asked = cancel_reason(cur, run.id)
    if asked is None:
        return False
    write_held(cur, run, ended(run, RunStatus.CANCELLED, now, asked), held_by=None)
    return True


def cancel_reason(cur: Cursor, run_id: str) -> str | None:
    """The reason of the cancel asked of ``run_id`` through a member, if one was asked."""
    row = cur.execute(
        "SELECT cancel_request FROM runs WHERE id = ? AND cancel_request IS NOT NULL",
        (run_id,),
    ).fetchone()
    return None if row is None else str(row[0])


def ids_not_queued(cur: Cursor, run_ids: Sequence[str]) -> list[str]:
    """Which of ``run_ids`` are not queued (or unknown), in their order: one statement."""
    if not run_ids:
        return []
    # One array parameter, however many ids, and only the ids that left come
    # back. A probe per id on the unique index of id (COLLATE "C", the
    # column's, lets it be used), as a subplan the planner cannot turn into
    # a join: a join planned on the statistics of a queue just filled
    # compared every id with every queued run (45 ms for 1,000 ids).
    rows = cur.execute(
        "SELECT given.id FROM unnest(?::text[]) WITH ORDINALITY AS given(id, n)"
        ' WHERE (SELECT status FROM runs WHERE runs.id = given.id COLLATE "C")'
        " IS DISTINCT FROM ? ORDER BY given.n",
        (list(run_ids), RunStatus.QUEUED.value),
    ).fetchall()
    return [str(row[0]) for row in rows]


def _running(cur: Cursor, where: str, params: tuple[Any, ...]) -> int:
    row = cur.execute(
        f"SELECT count(*) FROM runs WHERE status = ? AND {where}",
        (RunStatus.RUNNING.value, *params),
    ).fetchone()
    return int(row[0])


def write_held(cur: Cursor, current: RunRecord, record: RunRecord, *, held_by: str | None) -> None:
    """Update the run as :func:`update_life` does, and its holder; a held run only by its holder.

    ``held_by`` is the holder to record (the claimant, or ``None`` for a run
    not running) or, for a run leaving ``running``, the holder it must still
    have: the update matches nothing if another member holds it, and raises
    :class:`StoreConflict`.
    """
    values = life_values(record)
    if current.status is RunStatus.RUNNING:
        # NOT DISTINCT: a run left by a supervisor that held the ledger alone has no holder.
        cur.execute(
            _UPDATE + " AND held_by IS NOT DISTINCT FROM ?",
            (*values, current.id, current.status.value, held_by),
        )
        check_updated(cur, current, record, " on this supervisor")
    else:
        cur.execute(_UPDATE_HELD, (*values, held_by, current.id, current.status.value))
        check_updated(cur, current, record)
