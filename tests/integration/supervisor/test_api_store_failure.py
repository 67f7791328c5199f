"""A run ledger that fails (a locked SQLite file) answers 503 through the HTTP API and the CLI."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from cli_support import CLI, herdsman
from served_api import served_api
from store_faults import StalledStore
from supervisor_support import config_at, write_config

from herdsman.config import Config
from herdsman.runtime.ledger import LedgerBroken
from herdsman.runtime.main import DB_NAME
from herdsman.runtime.store import RunRecord, SqliteStore
from herdsman.runtime.supervisor import Supervisor


@attrs.define
class Served:
    """A supervisor on a real SQLite file, its API, a client, and what can lock the file."""

    config: Config
    ledger: Path
    client: httpx.AsyncClient
    supervisor: Supervisor

    def lock(self) -> sqlite3.Connection:
        """Another process's write lock on the ledger, as a backup or a stuck writer holds it."""
        locker = sqlite3.connect(self.ledger, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        return locker


@pytest.fixture
async def served(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Served]:
    config = config_at(write_config(tmp_path, concurrency=1))
    config.supervisor.state_dir.mkdir(parents=True)
    ledger = config.supervisor.state_dir / DB_NAME
    # A short busy timeout, so a write behind the lock fails at once (the
    # default waits 10 s, which is what a real supervisor keeps).
    store = SqliteStore(ledger, busy_timeout=0.05)
    async with served_api(config, store, nursery) as (supervisor, client):
        yield Served(config, ledger, client, supervisor)


def ledger_error(served: Served) -> str:
    return f"run ledger {str(served.ledger)!r}: database is locked"


async def test_a_submit_the_ledger_refuses_is_a_503_saying_it_was_not_recorded(
    served: Served,
) -> None:
    locker = served.lock()
    body = {"id": "r1", "provider": "demo", "prompt": "hello"}
    refused = await served.client.post("/v1/runs", json=body)
    assert refused.status_code == 503
    assert refused.json() == {
        "error": f"run r1 was not recorded: the run ledger failed ({ledger_error(served)});"
        ' submit it again with the same id, "r1": a known id returns the existing run,'
        " so a retry never queues it twice",
        "ids": ["r1"],
    }
    locker.rollback()
    again = await served.client.post("/v1/runs", json=body)
    assert again.status_code == 201, again.text
    assert again.json()["id"] == "r1"


async def test_a_refused_submit_without_an_id_names_the_id_to_retry_with(
    served: Served,
) -> None:
    locker = served.lock()
    body = {"provider": "demo", "prompt": "hello"}
    refused = await served.client.post("/v1/runs", json=body)
    locker.rollback()
    assert refused.status_code == 503
    [run_id] = refused.json()["ids"]
    assert f'submit it again with the same id, "{run_id}"' in refused.json()["error"]
    # The retry with that id records the run once; a second retry finds it.
    first = await served.client.post("/v1/runs", json={**body, "id": run_id})
    second = await served.client.post("/v1/runs", json={**body, "id": run_id})
    assert (first.status_code, second.status_code) == (201, 200)
    listed = (await served.client.get("/v1/runs")).json()["runs"]
    assert [run["id"] for run in listed] == [run_id]


async def test_a_batch_the_ledger_refuses_is_a_503_listing_its_ids(served: Served) -> None:
    locker = served.lock()
    runs = [{"id": "b1", "provider": "demo", "prompt": "x"}, {"provider": "demo", "prompt": "y"}]
    refused = await served.client.post("/v1/runs/batch", json={"runs": runs})
    locker.rollback()
    assert refused.status_code == 503
    answer = refused.json()
    ids = answer["ids"]
    assert ids[0] == "b1"
    assert len(ids) == 2
    assert answer["error"] == (
        f"the batch may be recorded in part: the run ledger failed ({ledger_error(served)});"
        ' submit it again with the same ids (in "ids"): a known id returns the existing'
        " run, so a retry never queues one twice"
    )
    again = await served.client.post(
        "/v1/runs/batch",
        json={"runs": [{**run, "id": run_id} for run, run_id in zip(runs, ids, strict=True)]},
    )
    assert again.status_code == 200, again.text
    assert [result["run"]["id"] for result in again.json()["results"]] == ids


@pytest.mark.parametrize(
    ("method", "path", "once_unlocked"),
    [
        ("GET", "/v1/runs/r1", 200),
        ("GET", "/v1/runs", 200),
        ("POST", "/v1/runs/r1/cancel", 409),  # it had ended: the answer a working ledger gives
    ],
)
async def test_a_read_or_cancel_the_ledger_cannot_answer_is_a_503(
    served: Served, method: str, path: str, once_unlocked: int
) -> None:
    created = await served.client.post(
        "/v1/runs", json={"id": "r1", "provider": "demo", "prompt": "hello"}
    )
    assert created.status_code == 201
    await served.client.get("/v1/runs/r1", params={"wait": 20})
    locker = served.lock()
    refused = await served.client.request(method, path)
    locker.rollback()
    assert (refused.status_code, refused.json()) == (
        503,
        {"error": f"the run ledger failed ({ledger_error(served)}); nothing changed: ask again"},
    )
    assert (await served.client.request(method, path)).status_code == once_unlocked


@pytest.mark.slow
async def test_the_cli_prints_the_503_in_one_line_and_exits_non_zero(
    served: Served, tmp_path: Path
) -> None:
    locker = served.lock()
    submitted = await trio.to_thread.run_sync(
        partial(herdsman, "submit", *CLI, "-p", "demo", "--id", "c1", "hello", cwd=tmp_path)
    )
    listed = await trio.to_thread.run_sync(partial(herdsman, "runs", *CLI, cwd=tmp_path))
    locker.rollback()
    assert submitted.returncode == 1
    assert submitted.stdout == ""
    assert submitted.stderr == (
        f"herdsman: run c1 was not recorded: the run ledger failed ({ledger_error(served)});"
        ' submit it again with the same id, "c1": a known id returns the existing run,'
        " so a retry never queues it twice (HTTP 503)\n"
    )
    assert listed.returncode == 1
    assert re.fullmatch(
        r"herdsman: the run ledger failed \(.*database is locked\); nothing changed:"
        r" ask again \(HTTP 503\)\n",
        listed.stderr,
    ), listed.stderr


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/runs", None),
        ("GET", "/v1/runs/r1", None),
        ("POST", "/v1/runs/r1/cancel", None),
        ("POST", "/v1/accounts/end-rest", {"provider": "demo"}),
    ],
)
async def test_a_request_after_the_ledger_closed_says_the_supervisor_is_stopping(
    served: Served, method: str, path: str, body: dict[str, str] | None
) -> None:
    # As a request in flight while the server shuts down after the supervisor
    # stopped: asking again cannot help, so the answer must not say to.
    created = await served.client.post(
        "/v1/runs", json={"id": "r1", "provider": "demo", "prompt": "hello"}
    )
    assert created.status_code == 201
    served.supervisor.request_shutdown()
    await served.supervisor.finished.wait()
    refused = await served.client.request(method, path, json=body)
    assert (refused.status_code, refused.json()) == (
        503,
        {"error": "the run ledger is closed: the supervisor is stopping"},
    )


async def test_submit_wait_names_the_run_it_submitted_when_the_wait_fails(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The submit is recorded; only the wait's reads meet the locked ledger.
    really_wait = served.supervisor.wait

    async def wait_on_a_locked_ledger(run_id: str, timeout: float) -> RunRecord:
        # The run ends first: a start or finish committed while the file is
        # locked would fail too, and stop the supervisor, which a loaded
        # machine's timing did now and then.
        await really_wait(run_id, timeout)
        locker = served.lock()
        try:
            return await really_wait(run_id, timeout)
        finally:
            locker.rollback()

    monkeypatch.setattr(served.supervisor, "wait", wait_on_a_locked_ledger)
    waited = await trio.to_thread.run_sync(
        partial(herdsman, "submit", *CLI, "-p", "demo", "--wait", "hello", cwd=tmp_path)
    )
    listed = (await served.client.get("/v1/runs")).json()["runs"]
    [run_id] = [run["id"] for run in listed]
    assert waited.returncode == 1
    assert waited.stdout == ""
    assert waited.stderr == (
        f"{run_id}: submitted; waiting for it to end\n"
        f"herdsman: run {run_id} was submitted; waiting for it failed: the run ledger failed"
        f" ({ledger_error(served)}); nothing changed: ask again (HTTP 503)\n"
    )


async def test_a_bug_the_ledger_met_is_a_500_not_an_unavailable_ledger(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the ledger hands the callers of a batch that failed with an error
    # that is no store failure (its writer dies of that error).
    async def broken(**_: object) -> list[RunRecord]:
        raise LedgerBroken("the run ledger failed: TypeError('a bug')")

    monkeypatch.setattr(served.supervisor, "list_runs", broken)
    answer = await served.client.get("/v1/runs")
    assert (answer.status_code, answer.json()) == (
        500,
        {"error": "internal error: LedgerBroken: the run ledger failed: TypeError('a bug')"},
    )


@pytest.mark.parametrize("batch", [False, True])
async def test_a_submit_that_meets_the_ledger_closed_says_to_wait_for_a_restart(
    tmp_path: Path, nursery: trio.Nursery, batch: bool
) -> None:
    # A submit admitted just before the shutdown, queued behind a commit the
    # ledger was still making when its writer was told to stop.
    config = config_at(write_config(tmp_path, concurrency=1))
    store = StalledStore(set())
    answers: list[httpx.Response] = []
    async with served_api(config, store, nursery) as (supervisor, client):

        async def post(path: str, body: object) -> None:
            answers.append(await client.post(path, json=body))

        store.stall("submit")
        nursery.start_soon(post, "/v1/runs", {"id": "first", "provider": "demo", "prompt": "x"})
        await trio.to_thread.run_sync(store.entered.wait)
        if batch:
            runs = [{"id": f"b{i}", "provider": "demo", "prompt": "x"} for i in (1, 2)]
            nursery.start_soon(post, "/v1/runs/batch", {"runs": runs})
        else:
            nursery.start_soon(post, "/v1/runs", {"id": "late", "provider": "demo", "prompt": "x"})
        await trio.testing.wait_all_tasks_blocked()
        supervisor.request_shutdown()
        # Nothing runs: the supervisor stops at once, but for its ledger's writer.
        await trio.testing.wait_all_tasks_blocked()
        store.go.set()
        await supervisor.finished.wait()
        with trio.fail_after(10):
            while len(answers) < 2:
                await trio.sleep(0.01)
    first, late = sorted(answers, key=lambda r: r.status_code)
    assert first.status_code == 201, first.text
    assert late.status_code == 503
    closed = "the run ledger is closed: the supervisor is stopping"
    if batch:
        assert late.json() == {
            "error": f"the batch was not recorded: {closed}, and accepts no runs until it is"
            " started again (by you, or by whatever restarts it); then submit them again with"
            ' the same ids (in "ids"): a known id returns the existing run, so a retry never'
            " queues one twice",
            "ids": ["b1", "b2"],
        }
    else:
        assert late.json() == {
            "error": f"run late was not recorded: {closed}, and accepts no runs until it is"
            " started again (by you, or by whatever restarts it); then submit it again with"
            ' the same id, "late": a known id returns the existing run, so a retry never'
            " queues it twice",
            "ids": ["late"],
        }
    assert [store.get(run_id) for run_id in ("late", "b1", "b2")] == [None] * 3


async def test_a_batch_item_the_ledger_refuses_gets_its_own_answer(served: Served) -> None:
    # One run the ledger itself refuses (a trigger, as a constraint or a full
    # disk would): it alone is not recorded, and says so; the others are.
    refuser = sqlite3.connect(served.ledger, isolation_level=None)
    refuser.execute(
        "CREATE TRIGGER refuse_b2 BEFORE INSERT ON runs WHEN NEW.id = 'b2'"
        " BEGIN SELECT RAISE(ABORT, 'b2 is refused here'); END"
    )
    runs = [{"id": f"b{i}", "provider": "demo", "prompt": "x"} for i in (1, 2, 3)]
    answer = await served.client.post("/v1/runs/batch", json={"runs": runs})
    assert answer.status_code == 200, answer.text
    first, refused, third = answer.json()["results"]
    assert (first["created"], first["run"]["id"]) == (True, "b1")
    assert (third["created"], third["run"]["id"]) == (True, "b3")
    assert refused == {
        "id": "b2",
        "error": f"run b2 was not recorded: the run ledger failed (run ledger"
        f" {str(served.ledger)!r}: b2 is refused here); submit it again with the same id,"
        ' "b2": a known id returns the existing run, so a retry never queues it twice',
    }
    listed = (await served.client.get("/v1/runs")).json()["runs"]
    assert sorted(run["id"] for run in listed) == ["b1", "b3"]
    refuser.execute("DROP TRIGGER refuse_b2")
    refuser.close()
    again = await served.client.post("/v1/runs/batch", json={"runs": runs})
    assert [(r["created"], r["run"]["id"]) for r in again.json()["results"]] == [
        (False, "b1"),
        (True, "b2"),
        (False, "b3"),
    ]
