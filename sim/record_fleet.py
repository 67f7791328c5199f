"""Record sim/fleet-m0.jsonl, fleet-m1.jsonl, fleet-m2.jsonl: three members of one fleet.

Three `herdsman run` processes (as sim/record_stops.py runs one) as fleet
members on one real PostgreSQL ledger, the demo agent, two slots each, a
poll every second, driven over their HTTP APIs:

1. Runs are submitted to every member on shared conversations, more than
   the six slots take: a member busy leaves its submits to the others,
   which take them at their polls; a conversation's next run waits for the
   run on another member, its claims refused (and the run parked) until
   that one ends.
2. A run is submitted with ``on_busy = "skip"`` to a conversation running
   on another member (skipped fleet-wide), and a queued run is cancelled
   at once through a member that has not polled it yet.
3. Once every run has ended, each member drains on SIGTERM.

Each member writes its own trace; replayed together
(``herdsman sim replay sim/fleet-m0.jsonl sim/fleet-m1.jsonl
sim/fleet-m2.jsonl --out-dir DIR``) they give each member's decisions.
Machine-specific paths are replaced by ``/demo``, the ledger's URL by a
placeholder, so the files are the same wherever they are recorded (but for
the times).

    HERDSMAN_TEST_POSTGRES_URL=... .venv/bin/python sim/record_fleet.py
    # then: python sim/regenerate.py
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

from record_stops import Life, free_port

HERE = Path(__file__).parent
NAMES = ("fleet-m0", "fleet-m1", "fleet-m2")
#: What the ledger's URL reads as in the shipped files.
URL_SHOWN = "postgresql://herdsman@ledger.example/herdsman"


def config_text(port: int, url: str) -> str:
    demo = f'["{sys.executable}", "-m", "herdsman.demo_agent", "--delay", "2"]'
    return f"""\
[supervisor]
state_dir = "state"
parallel_preamble = false

[providers.demo]
exec = {demo}
concurrency = 2

[store]
url = "{url}"

[fleet]
enabled = true
lease = "6s"
poll = "1s"

[api]
listen = "127.0.0.1:{port}"
"""


def without_password(url: str) -> tuple[str, str | None]:
    """``url`` without its password (``[store] url`` refuses one), and the password."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url, None
    netloc = parts.netloc.replace(f":{parts.password}@", "@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), parts.password


def record(folder: Path, url: str) -> list[Path]:
    """Record the three traces in ``folder``/m*/state/traces; their paths, by member."""
    url, password = without_password(url)
    env = dict(os.environ)
    if password is not None:
        env["PGPASSWORD"] = password
    members = []
    for n in range(3):
        home = folder / f"m{n}"
        home.mkdir()
        port = free_port()
        (home / "supervisor.toml").write_text(config_text(port, url))
        members.append(Life(home, port, env))
        time.sleep(0.3)  # members join one after another
    try:
        ids = _drive(members)
        for member in members:
            member.stop(signal.SIGTERM)
    except BaseException:
        for member in members:
            if member.process.poll() is None:
                member.process.kill()
                member.process.wait(30)
        raise
    traces = []
    for n in range(3):
        [trace] = (folder / f"m{n}" / "state" / "traces").glob("*.jsonl")
        traces.append(trace)
    del ids
    return traces


#: Between two submits: the runs' ends come as far apart, farther than a
#: busy machine delays a claim's commit (the replay orders a member's
#: decisions as its trace does; ends a few milliseconds apart, each freeing
#: a claim that commits late, could come out in another order).
SPACING = 0.25


def _drive(members: list[Life]) -> list[str]:
    """Submit, skip and cancel as the module docstring says; wait for every run's end."""
    m0, m1, m2 = members
    ids = []
    for member, conversation, run_id in (
        (m0, "c0", "f00"),
        (m0, "c1", "f01"),
        # c0 runs (f00): the others' claims of f02 are refused, and it is parked.
        (m1, "c0", "f02"),
        (m1, "c2", "f03"),
        (m2, "c3", "f04"),
    ):
        ids.append(member.submit("demo", conversation, id=run_id))
        time.sleep(SPACING)
    # c0 runs (f00) on one member: skipped fleet-wide.
    skipped = m2.submit("demo", "c0", id="f05", on_busy="skip")
    # Queued behind f02 on c0, cancelled at once through a member that has not
    # polled it yet (asked of the ledger: ``fleet_cancel``).
    doomed = m0.submit("demo", "c0", id="f06")
    answer = m1.client.post(f"/v1/runs/{doomed}/cancel")
    assert answer.status_code in (200, 202), answer.text
    ids += [skipped, doomed]
    for member, conversation, run_id in (
        (m1, "c1", "f07"),
        (m2, "c4", "f08"),
        (m2, "c5", "f09"),
        (m0, "c6", "f10"),
    ):
        time.sleep(SPACING)
        ids.append(member.submit("demo", conversation, id=run_id))
    time.sleep(2.5)
    for member, conversation, run_id in ((m1, "c2", "f11"), (m2, "c0", "f12"), (m0, "c3", "f13")):
        ids.append(member.submit("demo", conversation, id=run_id))
        time.sleep(SPACING)
    deadline = time.monotonic() + 90
    while True:
        states = [m0.status(run_id) for run_id in ids]
        if all(state not in ("queued", "running") for state in states):
            break
        assert time.monotonic() < deadline, dict(zip(ids, states, strict=True))
        time.sleep(0.1)
    assert m0.status(skipped) == "skipped"
    assert m0.status(doomed) == "cancelled"
    return ids


def shipped(text: str, folder: Path, url: str) -> str:
    """``text`` with the recording's machine-specific paths and the ledger's URL replaced."""
    url, _ = without_password(url)
    # The URL as the header's JSON writes it.
    for shown in (url, url.replace("/", "\\/")):
        text = text.replace(shown, URL_SHOWN)
    return text.replace(str(folder), "/demo").replace(sys.executable, "python3")


def main() -> None:
    url = os.environ.get("HERDSMAN_TEST_POSTGRES_URL")
    if not url:
        sys.exit("record_fleet.py: set HERDSMAN_TEST_POSTGRES_URL to a PostgreSQL server's URL")
    sys.path.insert(0, str(HERE.parent / "tests"))
    from postgres_support import fresh_schema  # noqa: PLC0415 - the tests' helper

    with tempfile.TemporaryDirectory() as name, fresh_schema(url) as schema_url:
        folder = Path(name).resolve()
        try:
            traces = record(folder, schema_url)
        except BaseException:
            for n in range(3):
                log = folder / f"m{n}" / "supervisor.log"
                if log.exists():
                    print(log.read_text(), file=sys.stderr)
            raise
        for trace, shipped_name in zip(traces, NAMES, strict=True):
            text = shipped(trace.read_text(encoding="utf-8"), folder, schema_url)
            (HERE / f"{shipped_name}.jsonl").write_text(text, encoding="utf-8")
            print(f"wrote sim/{shipped_name}.jsonl")


if __name__ == "__main__":
    main()
