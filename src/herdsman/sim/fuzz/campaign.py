"""A batch of seeds, and what to do with one that fails: minimise it and write it down."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json
from herdsman.sim.fuzz.harness import CONFIG_PATH, STARTED_AT, Verdict, run_scenario
from herdsman.sim.fuzz.minimise import Minimised, ddmin
from herdsman.sim.fuzz.scenario import draw_scenario
from herdsman.trace import TRACE_VERSION, format_time

__all__ = ["Batch", "fuzz_seeds", "minimise", "reproduce_command", "write_case"]


@attrs.frozen
class Batch:
    """What a batch of seeds did: totals, and the first failing verdict if any."""

    seeds: int
    runs: int
    faults: int
    simulated: float
    wall: float
    failure: Verdict | None


def fuzz_seeds(seeds: Iterable[int], on_seed: Callable[[Verdict], None] | None = None) -> Batch:
    """Run each seed's scenario in turn, stopping at the first that breaks an invariant."""
    count = runs = faults = 0
    simulated = wall = 0.0
    for seed in seeds:
        verdict = run_scenario(draw_scenario(seed))
        count += 1
        runs += verdict.scenario.run_count
        faults += verdict.faults  # those that took effect, not those drawn
        simulated += verdict.span
        wall += verdict.wall_seconds
        if on_seed is not None:
            on_seed(verdict)
        if verdict.failed:
            return Batch(count, runs, faults, simulated, wall, verdict)
    return Batch(count, runs, faults, simulated, wall, None)


def reproduce_command(seed: int) -> str:
    """The one line that runs ``seed`` again."""
    return f"herdsman sim fuzz --seeds 1 --seed {seed}"


def minimise(verdict: Verdict, *, budget: int = 200) -> tuple[Verdict, Minimised]:
    """The fewest of the scenario's events that still break the same invariant first."""
    assert verdict.violations, "only a failing verdict can be minimised"
    kind = verdict.violations[0].kind
    events = verdict.scenario.events

    def fails(kept: list[Mapping[str, Any]]) -> bool:
        again = run_scenario(verdict.scenario.with_events(kept))
        return bool(again.violations) and again.violations[0].kind == kind

    found = ddmin(events, fails, budget=budget)
    smaller = verdict.scenario.with_events([events[i] for i in found.indices])
    return run_scenario(smaller), found


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
