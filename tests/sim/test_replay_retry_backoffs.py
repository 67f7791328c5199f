"""Retries replayed from traces recorded under load: each backoff ends where the recording's did.

The supervisor reads the time when an attempt's process ends, then records
the finish in the ledger and traces it; the retry's backoff runs from that
reading. On a loaded machine the commit took 43 ms, and a replay that ended
the attempt at its finish's trace time ended the backoff that much later:
the next start came after another run's finish the recording traced after
it (the first trace), or a backoff ended before the finish of a run whose
own end the replay put too late (the second), or two backoffs ended in the
other order (the third). And the supervisor's timer for a backoff's end
fired late: a finish traced meanwhile came before the start (the fourth).
Each is the event order
``tests/integration/supervisor/test_replay_faults.py`` recorded in runs that
failed that way: the same runs (their ids fix the jittered delays), events,
times and the retries' ``at``, the spend left out.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import config_json

from herdsman.sim.decisions import read_decisions
from herdsman.sim.diff import first_divergence
from herdsman.sim.engine import fast_replay
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload

# The test's provider: two slots, three attempts, backoffs of 1 s then 2 s.
CONFIG = """\
[supervisor]
state_dir = "/s"
[providers.agent]
exec = ["x"]
protocol = "claude"
concurrency = 2
[providers.agent.retry]
attempts = 3
on = ["overloaded", "rate_limit", "crash"]
backoff = "1s"
backoff_max = "2s"
"""

STARTED = "2026-12-02T03:18:01.152277Z"
ORIGIN = dt.datetime.fromisoformat(STARTED).timestamp()


@pytest.fixture(autouse=True)
def _quiet() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)


def submit(t: float, run_id: str, conversation: str) -> dict[str, Any]:
    run = {"id": run_id, "provider": "agent", "conversation": conversation}
    return {"t": t, "event": "submit", "run": run}


def start(t: float, run_id: str) -> dict[str, Any]:
    return {"t": t, "event": "start", "run_id": run_id, "account": None}


def retry(
    t: float, run_id: str, attempt: int, failure: str, delay: float, *, read: float
) -> dict[str, Any]:
    """A traced retry whose supervisor read the time at ``read`` (trace time)."""
    at = ORIGIN + read + delay
    fields = {"run_id": run_id, "attempt": attempt, "failure": failure, "at": at, "delay": delay}
    return {"t": t, "event": "retry", **fields}


def finish(t: float, run_id: str, outcome: str, exit_code: int, **more: Any) -> dict[str, Any]:
    fields = {"run_id": run_id, "outcome": outcome, "exit_code": exit_code, "session": True}
    return {"t": t, "event": "finish", **fields, **more}


def recording(path: Path, events: list[dict[str, Any]]) -> Path:
    header = {"herdsman_trace": 1, "started_at": STARTED, "config": config_json(CONFIG)}
    lines = [header] + [{"t": e["t"], "seq": n, **e} for n, e in enumerate(events)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def replays_alike(trace: Path, engine: str) -> None:
    """``trace`` replayed by ``engine`` decides what it recorded, in the recorded order."""
    workload = read_workload(trace)
    loaded = config_from_trace(workload.header.config, str(trace))
    result = (fast_replay if engine == "fast" else replay)(workload, loaded)
    out = trace.with_name(f"{trace.stem}-{engine}.jsonl")
    out.write_text(result.trace, encoding="utf-8")
    assert first_divergence(read_decisions(trace), read_decisions(out)) is None


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_backoff_that_ended_before_another_finish_starts_its_run_before_it(
    tmp_path: Path, engine: str
) -> None:
    # exhausted's first attempt ended at 0.747266 (its retry's at less its
    # delay); its finish was traced 43 ms later. Its backoff ended at
    # 1.449019, it started at 1.486839, just before retried's finish
    # (1.488552): from the finish's trace time it would end at 1.492126.
    ids = {
        "retried": "run-97c84297c72a4f99a8279c260172af51",
        "exhausted": "run-f5ca4ee57dd947ffa24ee76fa48d2d42",
        "worked": "run-feb2627782714a6c8784c4a83a247c6a",
        "crashed": "run-7153a8d50496486eb6279f2d647dc27b",
    }
    events = [
        submit(0.346239, ids["retried"], "retried"),
        start(0.376257, ids["retried"]),
        submit(0.390217, ids["exhausted"], "exhausted"),
        start(0.414471, ids["exhausted"]),
        submit(0.421265, ids["worked"], "worked"),
        submit(0.498436, ids["crashed"], "crashed"),
        retry(0.730203, ids["retried"], 1, "overloaded", 0.684469, read=0.707024),
        finish(0.730293, ids["retried"], "failed", 1, failure="overloaded", requeued=True),
        start(0.730363, ids["worked"]),
        retry(0.790318, ids["exhausted"], 1, "rate_limit", 0.701753, read=0.747266),
        finish(0.790373, ids["exhausted"], "failed", 1, failure="rate_limit", requeued=True),
        start(0.790386, ids["crashed"]),
        finish(0.959296, ids["worked"], "failed", 1, failure="overloaded", worked=True),
        retry(1.133687, ids["crashed"], 1, "crash", 0.825509, read=1.126749),
        finish(1.133733, ids["crashed"], "failed", 3, failure="crash", requeued=True),
        start(1.399006, ids["retried"]),
        start(1.486839, ids["exhausted"]),
        finish(1.488552, ids["retried"], "succeeded", 0),
        retry(1.626007, ids["exhausted"], 2, "rate_limit", 1.119528, read=1.624509),
        finish(1.626054, ids["exhausted"], "failed", 1, failure="rate_limit", requeued=True),
        start(1.963436, ids["crashed"]),
        finish(2.05937, ids["crashed"], "succeeded", 0),
        start(2.746059, ids["exhausted"]),
        finish(2.836789, ids["exhausted"], "failed", 1, failure="rate_limit"),
        {"t": 2.843907, "event": "shutdown"},
    ]
    replays_alike(recording(tmp_path / "before.jsonl", events), engine)


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_backoff_that_ended_after_another_retried_end_starts_its_run_after_that_finish(
    tmp_path: Path, engine: str
) -> None:
    # exhausted's second attempt ended at 1.319298; its finish was traced at
    # 1.347107, after crashed's backoff ended (1.345458), and crashed started
    # behind it (1.369977). Ended at its finish's trace time, exhausted's
    # attempt would finish after crashed's backoff, which ends at 1.346325
    # from crashed's own finish time: the start would come first.
    ids = {
        "retried": "run-ee12cbe0b7834003808e2b92b497ccba",
        "exhausted": "run-085e3b4d23154776a5d8d5539cbe82e1",
        "worked": "run-ecc8e2c9dd4649b1a29b6cb0f5a54520",
        "crashed": "run-3e533d99d693449494e251c3d10a7d3f",
    }
    events = [
        submit(0.265273, ids["retried"], "retried"),
        start(0.294854, ids["retried"]),
        submit(0.299268, ids["exhausted"], "exhausted"),
        start(0.341568, ids["exhausted"]),
        submit(0.350718, ids["worked"], "worked"),
        submit(0.360741, ids["crashed"], "crashed"),
        retry(0.495131, ids["retried"], 1, "overloaded", 0.54567, read=0.483753),
        finish(0.495216, ids["retried"], "failed", 1, failure="overloaded", requeued=True),
        start(0.495292, ids["worked"]),
        retry(0.601653, ids["exhausted"], 1, "rate_limit", 0.578045, read=0.595264),
        finish(0.601697, ids["exhausted"], "failed", 1, failure="rate_limit", requeued=True),
        start(0.601709, ids["crashed"]),
        finish(0.695988, ids["worked"], "failed", 1, failure="overloaded", worked=True),
        retry(0.823942, ids["crashed"], 1, "crash", 0.522344, read=0.823114),
        finish(0.823981, ids["crashed"], "failed", 3, failure="crash", requeued=True),
        start(1.036141, ids["retried"]),
        finish(1.135467, ids["retried"], "succeeded", 0),
        start(1.182863, ids["exhausted"]),
        retry(1.347054, ids["exhausted"], 2, "rate_limit", 1.064602, read=1.319298),
        finish(1.347107, ids["exhausted"], "failed", 1, failure="rate_limit", requeued=True),
        start(1.369977, ids["crashed"]),
        finish(1.482751, ids["crashed"], "succeeded", 0),
        start(2.434846, ids["exhausted"]),
        finish(2.578854, ids["exhausted"], "failed", 1, failure="rate_limit"),
        {"t": 2.640334, "event": "shutdown"},
    ]
    replays_alike(recording(tmp_path / "after.jsonl", events), engine)


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_retried_end_read_before_a_start_traced_ahead_of_its_finish_ends_there(
    tmp_path: Path, engine: str
) -> None:
    # retried's and exhausted's first attempts ended at 0.411066 and 0.4115;
    # their finishes were traced at 0.451285 and 0.463468, worked's start
    # (which retried's end let start) between them. In a replay that start
    # comes with retried's end, so exhausted's end is not held back behind
    # its trace time: its backoff ends at 1.372846, before retried's
    # (1.400299), and exhausted starts first, as recorded.
    ids = {
        "retried": "run-db5c3a1ca4ad49e7b4581d8b172a4c35",
        "exhausted": "run-6406fd3a5e5e4dc183d05e6651a5d700",
        "worked": "run-0b7bb7a1bdf3446ca1f1dfc17576789b",
        "crashed": "run-d2a28f235d694a23aab80a9253804aeb",
    }
    events = [
        submit(0.200659, ids["retried"], "retried"),
        start(0.204089, ids["retried"]),
        submit(0.205202, ids["exhausted"], "exhausted"),
        start(0.291979, ids["exhausted"]),
        submit(0.292925, ids["worked"], "worked"),
        submit(0.301376, ids["crashed"], "crashed"),
        retry(0.4512, ids["retried"], 1, "overloaded", 0.989233, read=0.411066),
        finish(0.451285, ids["retried"], "failed", 1, failure="overloaded", requeued=True),
        start(0.451355, ids["worked"]),
        retry(0.463436, ids["exhausted"], 1, "rate_limit", 0.961346, read=0.4115),
        finish(0.463468, ids["exhausted"], "failed", 1, failure="rate_limit", requeued=True),
        start(0.463479, ids["crashed"]),
        finish(0.559134, ids["worked"], "failed", 1, failure="overloaded", worked=True),
        retry(0.575132, ids["crashed"], 1, "crash", 0.593681, read=0.57456),
        finish(0.575164, ids["crashed"], "failed", 3, failure="crash", requeued=True),
        start(1.170281, ids["crashed"]),
        finish(1.239739, ids["crashed"], "succeeded", 0),
        start(1.393742, ids["exhausted"]),
        start(1.408591, ids["retried"]),
        retry(1.502172, ids["exhausted"], 2, "rate_limit", 1.191088, read=1.499582),
        finish(1.502203, ids["exhausted"], "failed", 1, failure="rate_limit", requeued=True),
        finish(1.510755, ids["retried"], "succeeded", 0),
        start(2.694187, ids["exhausted"]),
        finish(2.787194, ids["exhausted"], "failed", 1, failure="rate_limit"),
        {"t": 2.792679, "event": "shutdown"},
    ]
    replays_alike(recording(tmp_path / "answered.jsonl", events), engine)


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_a_finish_traced_while_a_late_dispatcher_met_a_backoff_ends_before_it(
    tmp_path: Path, engine: str
) -> None:
    # crashed's backoff ended at 1.611626, but the loaded supervisor started
    # it only at 1.716427, after retried's finish (1.692545): its timer
    # fired late. The replay starts crashed when its backoff ends, so it
    # ends retried's attempt just before then (its start at 1.392649 allows
    # it): the finish, then crashed's start, as recorded.
    ids = {
        "retried": "run-4a85e7a434f248bd8b8ffc1e2f40824d",
        "exhausted": "run-fa25cdc0e3794166a023e21edcf755ed",
        "worked": "run-e424f887465547cdac2a4744b5c40da1",
        "crashed": "run-d66a33b0ed8340899af9fdc8f59027e9",
    }
    events = [
        submit(0.285473, ids["retried"], "retried"),
        start(0.30835, ids["retried"]),
        submit(0.317993, ids["exhausted"], "exhausted"),
        start(0.336817, ids["exhausted"]),
        submit(0.342749, ids["worked"], "worked"),
        submit(0.462, ids["crashed"], "crashed"),
        retry(0.672597, ids["retried"], 1, "overloaded", 0.710046, read=0.66084),
        finish(0.672688, ids["retried"], "failed", 1, failure="overloaded", requeued=True),
        start(0.672765, ids["worked"]),
        retry(0.67285, ids["exhausted"], 1, "rate_limit", 0.993867, read=0.66121),
        finish(0.672861, ids["exhausted"], "failed", 1, failure="rate_limit", requeued=True),
        start(0.672867, ids["crashed"]),
        finish(0.89039, ids["worked"], "failed", 1, failure="overloaded", worked=True),
        retry(0.977025, ids["crashed"], 1, "crash", 0.650635, read=0.960991),
        finish(0.977074, ids["crashed"], "failed", 3, failure="crash", requeued=True),
        start(1.392649, ids["retried"]),
        finish(1.692545, ids["retried"], "succeeded", 0),
        start(1.716427, ids["crashed"]),
        start(1.760464, ids["exhausted"]),
        finish(1.895045, ids["crashed"], "succeeded", 0),
        retry(1.921796, ids["exhausted"], 2, "rate_limit", 1.935177, read=1.920832),
        finish(1.92183, ids["exhausted"], "failed", 1, failure="rate_limit", requeued=True),
        start(3.907688, ids["exhausted"]),
        finish(4.088416, ids["exhausted"], "failed", 1, failure="rate_limit"),
        {"t": 4.232382, "event": "shutdown"},
    ]
    replays_alike(recording(tmp_path / "late.jsonl", events), engine)


@pytest.mark.parametrize("engine", ["trio", "fast"])
def test_an_end_read_after_a_backoff_ended_whose_timer_was_late_still_ends_before_it(
    tmp_path: Path, engine: str
) -> None:
    # The trace above as a supervisor that writes ``ended`` and ``decided``
    # records it: every start says when it was decided, every finish when
    # its end was read. crashed's backoff ended at 1.611626; its timer had
    # not fired when retried's end was read, at 1.64, and that end's own
    # dispatch started crashed (decided 1.64, as the finish's ended). The
    # replay's timer is due at 1.611626; late_wake takes it to 1.64, no
    # later than retried's end there, and a timer acts before an end at
    # the same moment: crashed would start ahead of retried's finish.
    # Ending retried just before the backoff ends (the heuristic older
    # traces need) keeps the recorded order, so these traces need it too.
    ids = {
        "retried": "run-4a85e7a434f248bd8b8ffc1e2f40824d",
        "exhausted": "run-fa25cdc0e3794166a023e21edcf755ed",
        "worked": "run-e424f887465547cdac2a4744b5c40da1",
        "crashed": "run-d66a33b0ed8340899af9fdc8f59027e9",
    }

    def decided(event: dict[str, Any], at: float) -> dict[str, Any]:
        return {**event, "decided": at}

    events = [
        submit(0.285473, ids["retried"], "retried"),
        decided(start(0.30835, ids["retried"]), 0.3083),
        submit(0.317993, ids["exhausted"], "exhausted"),
        decided(start(0.336817, ids["exhausted"]), 0.3367),
        submit(0.342749, ids["worked"], "worked"),
        submit(0.462, ids["crashed"], "crashed"),
        retry(0.672597, ids["retried"], 1, "overloaded", 0.710046, read=0.66084),
        finish(
            0.672688,
            ids["retried"],
            "failed",
            1,
            failure="overloaded",
            requeued=True,
            ended=0.66084,
        ),
        decided(start(0.672765, ids["worked"]), 0.66084),
        retry(0.67285, ids["exhausted"], 1, "rate_limit", 0.993867, read=0.66121),
        finish(
            0.672861,
            ids["exhausted"],
            "failed",
            1,
            failure="rate_limit",
            requeued=True,
            ended=0.66121,
        ),
        decided(start(0.672867, ids["crashed"]), 0.66121),
        finish(
            0.89039, ids["worked"], "failed", 1, failure="overloaded", worked=True, ended=0.8903
        ),
        retry(0.977025, ids["crashed"], 1, "crash", 0.650635, read=0.960991),
        finish(
            0.977074, ids["crashed"], "failed", 3, failure="crash", requeued=True, ended=0.960991
        ),
        decided(start(1.392649, ids["retried"]), 1.3925),
        finish(1.692545, ids["retried"], "succeeded", 0, ended=1.64),
        decided(start(1.716427, ids["crashed"]), 1.64),
        decided(start(1.760464, ids["exhausted"]), 1.7603),
        finish(1.895045, ids["crashed"], "succeeded", 0, ended=1.8949),
        retry(1.921796, ids["exhausted"], 2, "rate_limit", 1.935177, read=1.920832),
        finish(
            1.92183,
            ids["exhausted"],
            "failed",
            1,
            failure="rate_limit",
            requeued=True,
            ended=1.920832,
        ),
        decided(start(3.907688, ids["exhausted"]), 3.9075),
        finish(4.088416, ids["exhausted"], "failed", 1, failure="rate_limit", ended=4.0883),
        {"t": 4.232382, "event": "shutdown"},
    ]
    replays_alike(recording(tmp_path / "late-read.jsonl", events), engine)
