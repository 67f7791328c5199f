"""What ``GET /v1/status`` and ``herdsman status`` show, built from read-only queries.

Nothing here changes the supervisor, its lifecycle or the fleet: each view
is a plain function of what the domain objects answer when asked (the
lifecycle's scheduler snapshot and account statuses, the ledger's fleet
view), so the shapes the API promises live in one place, apart from the
classes that decide.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from herdsman.core.lifecycle import Lifecycle
from herdsman.runtime.accounts import account_view, blocked_view
from herdsman.runtime.reload import Change, ReloadResult

if TYPE_CHECKING:
    from herdsman.runtime.store.fleet import FleetView

__all__ = ["PROVIDER_GONE", "accounts_status", "fleet_status", "status", "waiting_for_accounts"]

PROVIDER_GONE = (
    "its provider was removed from the configuration; "
    "its queued runs wait until it is configured again"
)


def accounts_status(life: Lifecycle, now: float) -> list[dict[str, Any]]:
    """Every account: in use, usage in its window, resting until, runs started."""
    return [account_view(s) for s in life.book.statuses(now)]


def waiting_for_accounts(life: Lifecycle, now: float) -> dict[str, dict[str, Any]]:
    """Providers whose queued runs wait because no account can take them: why, until when."""
    book, scheduler = life.book, life.scheduler
    waiting = {}
    for provider in book.providers:
        if scheduler.queued_for(provider):
            blocked = book.blocked(provider, now)
            if blocked is not None:
                waiting[provider] = blocked_view(blocked)
    return waiting


def status(
    life: Lifecycle,
    *,
    now: float,
    oldest_submitted_at: float | None,
    generation: int,
    lost_at_startup: int,
    providers: Collection[str],
    last_reload: ReloadResult | None,
    waiting_for_restart: Sequence[Change],
) -> dict[str, Any]:
    """Limits, running and queued counts, the oldest wait, accounts and the last reload.

    ``oldest_submitted_at``: when the run at the head of the queue was
    submitted, if one is queued; ``providers``: those configured now.

    A run waiting out a retry's backoff is ``queued`` (the ledger says so,
    and it starts with nothing more asked) and also ``retrying``; the
    scheduler holds it, as it holds a fleet member's parked run, so it is
    taken out of ``parked``.
    """
    scheduler = life.scheduler
    snap = scheduler.snapshot()
    age = None if oldest_submitted_at is None else now - oldest_submitted_at
    limits = scheduler.limits
    retrying, next_retry_at = _retrying(life)
    return {
        "admitting": life.admitting,
        "generation": generation,
        "limits": {"global": limits.global_cap, "providers": dict(limits.provider_caps)},
        "running": snap.running,
        "queued": snap.queued + sum(retrying.values()),
        "retrying": sum(retrying.values()),
        "next_retry_at": next_retry_at,
        "parked": snap.held - sum(retrying.values()),
        "running_by_provider": dict(snap.running_by_provider),
        "queued_by_provider": _added(snap.queued_by_provider, retrying),
        "retrying_by_provider": retrying,
        "parked_by_provider": _added(snap.held_by_provider, retrying, sign=-1),
        "queued_by_lane": dict(snap.queued_by_lane),
        "oldest_queued_age": None if age is None else max(0.0, age),
        "lost_at_startup": lost_at_startup,
        "accounts": accounts_status(life, now),
        "waiting_for_accounts": waiting_for_accounts(life, now),
        "waiting_for_provider": {
            provider: PROVIDER_GONE
            for provider in sorted(snap.queued_by_provider)
            if provider not in providers
        },
        "last_reload": None if last_reload is None else last_reload.as_json(),
        "waiting_for_restart": [change.as_json() for change in waiting_for_restart],
    }


def _retrying(life: Lifecycle) -> tuple[dict[str, int], float | None]:
    """Runs waiting out a retry's backoff, by provider (sorted), and when the first one ends.

    They are the held runs with a backoff; the others are parked by a
    fleet member's refused claim. O(held runs).
    """
    counts: dict[str, int] = {}
    soonest: float | None = None
    for run in life.scheduler.held_runs():
        at = life.backoff_of(run.id)
        if at is None:
            continue
        counts[run.provider] = counts.get(run.provider, 0) + 1
        soonest = at if soonest is None else min(soonest, at)
    return dict(sorted(counts.items())), soonest


def _added(counts: Mapping[str, int], more: Mapping[str, int], sign: int = 1) -> dict[str, int]:
    """``counts`` plus (``sign`` -1: less) ``more`` by provider, in their order; no zero kept."""
    total = dict(counts)
    for provider, count in more.items():
        total[provider] = total.get(provider, 0) + sign * count
    return {provider: n for provider, n in total.items() if n}


def _by_provider(item: tuple[tuple[str | None, str], int]) -> str:
    return item[0][1]


def fleet_status(view: FleetView, member_id: str) -> dict[str, Any]:
    """The fleet ``view`` as ``GET /v1/status`` shows it under ``fleet`` (docs/fleet.md).

    ``member_id``: this member's. Lease times are the server's clock;
    ``lease_left`` is how long each lease runs still, by that clock
    (negative: lapsed, not yet expired).
    """
    members = []
    for member in view.members:
        by_provider = {
            provider: count
            for (holder, provider), count in sorted(view.running.items(), key=_by_provider)
            if holder == member.id
        }
        members.append(
            {
                "id": member.id,
                "host": member.host,
                "pid": member.pid,
                "this": member.id == member_id,
                "joined_at": member.joined_at,
                "lease_until": member.lease_until,
                "lease_left": member.lease_until - view.clock,
                "running": sum(by_provider.values()),
                "running_by_provider": by_provider,
            }
        )
    known = {member.id for member in view.members}
    unheld = sum(count for (holder, _), count in view.running.items() if holder not in known)
    return {
        "member_id": member_id,
        "members": members,
        "running": sum(view.running.values()),
        "running_unheld": unheld,
    }
