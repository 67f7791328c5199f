"""What a fleet member's ledger raises when the fleet refuses a write, on a real server.

A member retries a refused finish unless the refusal is final (its lease
lapsed, the run was declared lost): ``refused_for_good`` decides by the
error's class. These refusals come from inside an operation, so the batch
hands them over as they are; a commit that fails as a whole (the connection
lost, and the server still unreachable) is a plain :class:`StoreError` or a
:class:`ConnectionLost`, which is worth retrying.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio

from herdsman.runtime.ledger import Ledger
from herdsman.runtime.store import NewRun, RunEnd, RunStatus, Store, StoreConflict, StoreError
from herdsman.runtime.store.errors import ConnectionLost
from herdsman.runtime.store.fleet import FleetStore, LeaseExpired
from herdsman.runtime.supervisor.outcomes import refused_for_good
from postgres_support import end_lease, ledger_member

T0 = 1_700_000_000.0


member = ledger_member


async def refusal(store: FleetStore, operation: Callable[[Store], Any]) -> StoreError:
    """The error ``operation`` raises through a ledger over ``store`` (a commit and all)."""
    ledger = Ledger(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(ledger.run)
        with pytest.raises(StoreError) as raised:
            await ledger.call(operation)
        nursery.cancel_scope.cancel()
    return raised.value


async def test_a_lapsed_member_s_refusals_reach_the_supervisor_as_final(
    postgres_url: str,
) -> None:
    gone, live = member(postgres_url, "gone"), member(postgres_url, "live")
    try:
        live.submit(NewRun(id="r1", provider="p", prompt="x"), T0)
        live.submit(NewRun(id="r2", provider="p", prompt="x"), T0)
        assert len(gone.claim_many([("r1", None)], T0).claimed) == 1
        end_lease(postgres_url, gone.member_id)
        assert [r.id for r in live.expire_lapsed(T0 + 1)] == ["r1"]

        finish = await refusal(gone, lambda s: s.finish("r1", RunEnd(RunStatus.SUCCEEDED), T0 + 2))
        claim = await refusal(gone, lambda s: gone.claim_many([("r2", None)], T0 + 2))
        assert type(finish) is StoreConflict
        assert type(claim) is LeaseExpired
        assert refused_for_good(finish)
        assert refused_for_good(claim)
    finally:
        gone.close()
        live.close()


async def test_a_finish_the_connection_broke_under_is_recorded_on_a_new_connection(
    postgres_url: str,
) -> None:
    # A server restart, as the member sees it: its session is gone. The
    # member's finish is recorded at once, not refused until a restart.
    store = member(postgres_url, "a", 60.0)
    try:
        store.submit(NewRun(id="r1", provider="p", prompt="x"), T0)
        assert len(store.claim_many([("r1", None)], T0).claimed) == 1
        with psycopg.connect(postgres_url, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (store._conn.info.backend_pid,))
        ledger = Ledger(store)
        async with trio.open_nursery() as nursery:
            await nursery.start(ledger.run)
            finished = await ledger.call(
                lambda s: s.finish("r1", RunEnd(RunStatus.SUCCEEDED), T0 + 1)
            )
            nursery.cancel_scope.cancel()
        assert finished.status is RunStatus.SUCCEEDED
        assert store.get("r1") == finished
    finally:
        store.close()


def test_a_connection_the_store_could_not_make_again_is_worth_retrying() -> None:
    # Raised while the server stays unreachable: a member records the finish again.
    lost = ConnectionLost("run ledger on PostgreSQL server: connection refused")
    assert not refused_for_good(lost)
