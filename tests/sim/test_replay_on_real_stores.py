"""The supervisor decides the same on every ledger: random workloads replayed into
an in-memory, a SQLite and a PostgreSQL store give the same trace and the same ledger.

The scheduling rules are proved on the in-memory store by the core's property
tests and the engine-equivalence tests; byte-identical traces carry them over
to the stores production uses. The ledgers are compared too, so a store that
recorded an outcome, an account or an attempt differently cannot hide behind
a trace that only says what the supervisor believed.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from random_workloads import workloads

from herdsman.config import LoadedConfig
from herdsman.runtime.store import MemoryStore, SqliteStore, Store
from herdsman.runtime.store.postgres import PostgresStore
from herdsman.sim.replay import replay
from herdsman.sim.workload import Workload
from postgres_support import fresh_schema, server_url

StoreMaker = Callable[[], AbstractContextManager[Store]]


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


@contextmanager
def sqlite_store() -> Iterator[Store]:
    with tempfile.TemporaryDirectory() as folder:
        store = SqliteStore(Path(folder) / "herdsman.db")
        try:
            yield store
        finally:
            store.close()


def postgres_store() -> StoreMaker:
    server = server_url()  # skips (fails under CI) without a server

    @contextmanager
    def make() -> Iterator[Store]:
        with fresh_schema(server) as url:
            store = PostgresStore(url)
            try:
                yield store
            finally:
                store.close()

    return make


@pytest.fixture(params=["sqlite", "postgres"])
def real_store(request: pytest.FixtureRequest) -> StoreMaker:
    """A fresh, empty ledger per call, on the parametrised database."""
    return sqlite_store if request.param == "sqlite" else postgres_store()


def ledger(store: Store) -> list[tuple[Any, ...]]:
    """Every run in the ledger, in submission order, field by field."""
    runs = sorted(store.list_runs(limit=1_000_000), key=lambda r: r.seq)
    return [attrs.astuple(run, recurse=False) for run in runs]


# The fixture is a factory: every example opens a fresh ledger of its own.
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(case=workloads())
@pytest.mark.slow
def test_a_replay_decides_the_same_on_every_store(
    real_store: StoreMaker, case: tuple[Workload, LoadedConfig]
) -> None:
    workload, loaded = case
    memory = MemoryStore()
    expected = replay(workload, loaded, store=memory)
    with real_store() as store:
        got = replay(workload, loaded, store=store)
        assert got.trace == expected.trace
        assert (got.runs, got.left_queued) == (expected.runs, expected.left_queued)
        assert ledger(store) == ledger(memory)
        assert store.counts() == memory.counts()
