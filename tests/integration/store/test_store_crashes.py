"""A supervisor killed inside a batch, on each real store: the batch leaves nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from herdsman.runtime.store import LOST_ON_RESTART, RunStatus, SqliteStore, Store
from herdsman.runtime.store.postgres import PostgresStore

CRASH_INSIDE_A_BATCH = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from herdsman.runtime.store import NewRun, RunEnd, RunStatus, SqliteStore
    from herdsman.runtime.store.postgres import PostgresStore

    kind, where = sys.argv[1:]
    store = SqliteStore(Path(where)) if kind == "sqlite" else PostgresStore(where)
    store.submit(NewRun(id="r", provider="claude", prompt="p"), 100.0)
    store.mark_running("r", 101.0, "acct")

    def crash(s):
        print("finished", s.get("r").status.value, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    store.apply(
        [
            lambda s: s.finish("r", RunEnd(RunStatus.USAGE_LIMITED, reason="limit"), 102.0),
            crash,
            lambda s: s.requeue("r"),
        ],
        durable=True,
    )
    """
)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_crash_between_finish_and_requeue_in_one_batch_keeps_neither(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = (
        str(tmp_path / "herdsman.db")
        if kind == "sqlite"
        else request.getfixturevalue("postgres_url")
    )
    result = subprocess.run(
        [sys.executable, "-c", CRASH_INSIDE_A_BATCH, kind, where],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    # The process had recorded usage_limited inside the batch when it died...
    assert result.stdout == "finished usage_limited\n"
    store: Store = SqliteStore(Path(where)) if kind == "sqlite" else PostgresStore(where)
    try:
        # ...but the batch never committed: no usage_limited row is left behind
        # that nobody re-queued; the run is found running, like any crash.
        record = store.get("r")
        assert record is not None
        assert (record.status, record.account, record.attempts) == (RunStatus.RUNNING, "acct", 1)
        assert store.counts()[RunStatus.USAGE_LIMITED] == 0
        lost = store.recover(200.0)
        assert [(r.id, r.reason) for r in lost] == [("r", LOST_ON_RESTART)]
    finally:
        store.close()
