"""A batch of seeds, and what to do with one that fails: minimise it and write it down."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import functools
import itertools
import json
import logging
import multiprocessing
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json
from herdsman.sim.fuzz.harness import (
    CONFIG_PATH,
    STARTED_AT,
    WALL_LIMIT,
    Verdict,
    run_scenario,
)
from herdsman.sim.fuzz.minimise import Minimised, ddmin
from herdsman.sim.fuzz.scenario import Scenario, draw_scenario
from herdsman.trace import TRACE_VERSION, format_time

__all__ = ["Batch", "fuzz_seeds", "minimise", "reproduce_command", "write_case"]


@attrs.frozen
class Batch:
    """What a batch of seeds did: totals, and the first failing verdict if any.

    The totals run up to the first failing seed, whatever the number of
    workers (seeds after it that a worker ran meanwhile are not counted).
    """

    seeds: int
    runs: int
    faults: int
    simulated: float
    #: The seeds' own wall-clock seconds, added up.
    wall: float
    failure: Verdict | None
    #: The batch's wall-clock seconds, start to end.
    elapsed: float = 0.0


def fuzz_seeds(
    seeds: Iterable[int],
    on_seed: Callable[[Verdict], None] | None = None,
    *,
    workers: int = 1,
    wall_limit: float | None = WALL_LIMIT,
    on_start: Callable[[Scenario], None] | None = None,
    on_end: Callable[[int], None] | None = None,
) -> Batch:
    """Run each seed's scenario, stopping at the first (lowest) that breaks an invariant.

    ``workers`` above 1 runs seeds side by side in that many processes; the
    verdicts are handed to ``on_seed`` in seed order all the same, so the
    batch (totals, failure) is the same for any number of workers.
    ``on_start`` is told of each scenario as it is handed to a worker, and
    ``on_end`` of each seed as its run ends (in any order, from any thread).
    ``wall_limit`` bounds each seed in wall-clock seconds (``run_scenario``).
    """
    began = time.perf_counter()
    count = runs = faults = 0
    simulated = wall = 0.0
    failure: Verdict | None = None
    for verdict in _verdicts(seeds, workers, wall_limit, on_start, on_end or _nothing):
        count += 1
        runs += verdict.scenario.run_count
        faults += verdict.faults  # those that took effect, not those drawn
        simulated += verdict.span
        wall += verdict.wall_seconds
        if on_seed is not None:
            on_seed(verdict)
        if verdict.failed:
            failure = verdict
            break
    elapsed = time.perf_counter() - began
    return Batch(count, runs, faults, simulated, wall, failure, elapsed)


def _verdicts(
    seeds: Iterable[int],
    workers: int,
    wall_limit: float | None,
    on_start: Callable[[Scenario], None] | None,
    on_end: Callable[[int], None],
) -> Iterator[Verdict]:
    """Each seed's verdict, in seed order; stop asking and the workers stop."""
    if workers <= 1:
        for seed in seeds:
            scenario = draw_scenario(seed)
            if on_start is not None:
                on_start(scenario)
            verdict = run_scenario(scenario, wall_limit=wall_limit)
            on_end(seed)
            yield verdict
        return
    # Spawned, not forked: a fork would copy this process's threads' state
    # (a scenario's abandoned trio thread, a lock held) into the worker.
    context = multiprocessing.get_context("spawn")
    order = iter(seeds)
    running: dict[int, concurrent.futures.Future[Verdict]] = {}
    queued: list[int] = []  # seeds handed out, in order
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_quiet
    ) as pool:
        try:
            while True:
                # One seed running per worker; a slow seed holds back the
                # hand-over (in order), not the workers, up to a point.
                busy = sum(1 for future in running.values() if not future.done())
                room = min(workers - busy, workers * _AHEAD - len(running))
                for seed in itertools.islice(order, max(room, 0)):
                    scenario = draw_scenario(seed)
                    if on_start is not None:
                        on_start(scenario)
                    running[seed] = pool.submit(run_scenario, scenario, wall_limit=wall_limit)
                    running[seed].add_done_callback(functools.partial(_ended, on_end, seed))
                    queued.append(seed)
                if not queued:
                    return
                concurrent.futures.wait(
                    [future for future in running.values() if not future.done()],
                    return_when=concurrent.futures.FIRST_COMPLETED,
                )
                # Hand over what is done, in order; a later seed waits its turn.
                while queued and running[queued[0]].done():
                    yield running.pop(queued.pop(0)).result()
        finally:
            for future in running.values():
                future.cancel()


def _nothing(seed: int) -> None:
    """No one to tell."""


def _ended(on_end: Callable[[int], None], seed: int, _: object) -> None:
    on_end(seed)


#: How many seeds a worker may run ahead of the slowest one not yet handed over.
_AHEAD = 8


def _quiet() -> None:
    """A worker's set-up: the simulated supervisor's own logs are not news (the verdict is)."""
    logging.getLogger("herdsman").setLevel(logging.CRITICAL)


def reproduce_command(seed: int) -> str:
    """The one line that runs ``seed`` again."""
    return f"herdsman sim fuzz --seeds 1 --seed {seed}"


def minimise(
    verdict: Verdict, *, budget: int = 200, wall_limit: float | None = WALL_LIMIT
) -> tuple[Verdict, Minimised]:
    """The fewest of the scenario's events that still break the same invariant first."""
    assert verdict.violations, "only a failing verdict can be minimised"
    kind = verdict.violations[0].kind
    events = verdict.scenario.events

    def fails(kept: list[Mapping[str, Any]]) -> bool:
        again = run_scenario(verdict.scenario.with_events(kept), wall_limit=wall_limit)
        return bool(again.violations) and again.violations[0].kind == kind

    found = ddmin(events, fails, budget=budget)
    smaller = verdict.scenario.with_events([events[i] for i in found.indices])
    return run_scenario(smaller, wall_limit=wall_limit), found


def write_case(path: Path, verdict: Verdict) -> None:
    """Write ``verdict``'s scenario as a trace file that ``herdsman sim replay`` runs again."""
    scenario = verdict.scenario
    loaded = load_config_text(scenario.config, CONFIG_PATH, environ={})
    fuzz = scenario.as_json()
    if verdict.violations:
        fuzz["violation"] = str(verdict.violations[0])
    header = {
        "herdsman_trace": TRACE_VERSION,
        "started_at": format_time(dt.datetime.fromtimestamp(STARTED_AT, dt.UTC)),
        "config": config_as_json(loaded.config),
        "fuzz": fuzz,
    }
    path.write_text(json.dumps(header, indent=None) + "\n", encoding="utf-8")
