"""``herdsman sim plan``: simulate a workload under each configuration of a sweep.

Each configuration (:mod:`herdsman.sim.sweep`) is simulated on N
replications of the workload, and each metric (:mod:`herdsman.sim.metrics`)
gets a mean and a 95% Student-t confidence interval across them. What a
replication is depends on the input:

* a **generated** workload (its header names the model and seed it was drawn
  from): replication 0 is the file itself; replication r >= 1 is the same
  model drawn again with a seed derived from ``(--seed, r)``;
* a **recorded** trace: replication 0 is the trace as recorded; in
  replication r >= 1 every attempt's duration is redrawn (with replacement,
  seed derived from ``(--seed, r)``) from the durations of the recorded
  attempts that did their work, while arrivals, conversations and outcomes
  stay as recorded. A deterministic engine replays a fixed trace the same
  way every time; this asks how much the answer owes to which runs happened
  to be long.

Every configuration sees the same replications (common random numbers), so
differences between configurations are not noise between workloads. Tasks
run in worker processes; each result is filed under its (configuration,
replication) and nothing depends on which worker finished first, so the
output is the same whatever ``workers`` is.
"""

from __future__ import annotations

import logging
import multiprocessing
import random
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import attrs

from herdsman.config import LoadedConfig
from herdsman.config.report import config_as_json
from herdsman.sim.generate import Samples, generate, load_samples, recorded_durations
from herdsman.sim.metrics import METRICS, Metrics, measure
from herdsman.sim.model import Model, ModelError, model_from_json
from herdsman.sim.slo import Slo
from herdsman.sim.stats import Estimate, estimate
from herdsman.sim.sweep import Setting, Vary, configure, settings
from herdsman.sim.workload import (
    RunPlan,
    Workload,
    config_from_trace,
    read_workload,
    read_workload_text,
)

__all__ = [
    "DEFAULT_ENGINE",
    "Engine",
    "PlanInput",
    "PlanResult",
    "Row",
    "collect",
    "plan",
    "read_input",
    "replication",
    "replication_seed",
    "trio_engine",
]

#: An engine simulates a workload under a configuration and returns the
#: metrics of the simulated trace (what :func:`herdsman.sim.metrics.measure`
#: reads from it). With more than one worker it is pickled: a module-level
#: function.
Engine = Callable[[Workload, LoadedConfig], Metrics]


def trio_engine(workload: Workload, loaded: LoadedConfig) -> Metrics:
    """The full-fidelity replay (the real supervisor under trio) as an engine."""
    from herdsman.sim.replay import replay  # noqa: PLC0415 - pyfakefs is heavy

    return measure(replay(workload, loaded).trace)


def fast_engine(workload: Workload, loaded: LoadedConfig) -> Metrics:
    """The fast engine: the same decisions from the decision cores alone (see
    ``tests/sim/test_engine_equivalence.py``), hundreds of times faster.

    It writes no trace: it adds up the metrics as the events happen, the
    same figures :func:`~herdsman.sim.metrics.measure` reads from its trace.
    """
    from herdsman.sim.engine import FastEngine  # noqa: PLC0415

    engine = FastEngine(workload, loaded, trace=False, metrics=True)
    engine.run()
    return engine.metrics()


#: The engine ``sim plan`` uses.
DEFAULT_ENGINE: Engine = fast_engine


@attrs.frozen
class PlanInput:
    """The workload a plan starts from, and what its replications are drawn from."""

    path: Path
    workload: Workload
    #: For a generated workload: the model and the seed it was drawn with.
    model: Model | None
    seed: int | None
    samples: Samples

    @property
    def kind(self) -> str:
        """``generated`` or ``recorded``."""
        return "generated" if self.model is not None else "recorded"


def read_input(path: Path) -> PlanInput:
    """Read ``path``; TraceFormatError or ModelError naming it if it is not usable."""
    workload = read_workload(path)
    generator = workload.header.generator
    if generator is None:
        return PlanInput(path, workload, None, None, Samples())
    model = model_from_json(generator.get("model") or {}, f"{path}:1")
    seed = generator.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ModelError(f"{path}:1: generator.seed: expected a whole number, got {seed!r}")
    return PlanInput(path, workload, model, seed, load_samples(model))


def replication_seed(seed: int, replication: int) -> int:
    """The seed of a replication: from a string, which ``random`` hashes with SHA-512."""
    return random.Random(f"herdsman-plan:{seed}:{replication}").getrandbits(63)


def replication(source: PlanInput, number: int, seed: int) -> Workload:
    """Replication ``number`` of ``source`` (see the module docstring)."""
    if number == 0:
        return source.workload
    drawn = replication_seed(seed, number)
    if source.model is not None:
        header = source.workload.header
        text = generate(source.model, header.config, drawn, source.samples)
        return read_workload_text(text, f"{source.path} (replication {number})")
    try:
        pool = recorded_durations(source.workload, str(source.path))
    except ModelError:
        raise ModelError(
            f"{source.path}: a replication of a recorded trace redraws its runs' durations,"
            " and no run in it has one (no succeeded, failed or timed-out run):"
            " use --replications 1"
        ) from None
    rng = random.Random(drawn)
    plans = {
        run_id: RunPlan(
            plan.index,
            [attrs.evolve(attempt, duration=rng.choice(pool)) for attempt in plan.attempts],
            plan.synthetic,
        )
        for run_id, plan in source.workload.plans.items()
    }
    return attrs.evolve(source.workload, plans=plans)


@attrs.frozen
class Row:
    """One configuration: its setting, each metric's estimate, and whether it meets the SLO."""

    setting: Setting
    estimates: Mapping[str, Estimate]
    meets: bool


@attrs.frozen
class PlanResult:
    """Every configuration's row, in sweep order, and the smallest meeting the SLO."""

    rows: tuple[Row, ...]
    smallest: Row | None
    slo: Slo
    replications: int
    seed: int
    kind: str


@attrs.frozen
class _Task:
    config: int
    replication: int
    workload: Workload
    settings: Mapping[str, Any]
    engine: Engine


def _simulate(task: _Task) -> tuple[int, int, Metrics]:
    # The simulated supervisor's log (usage limits, checkouts) is not news here.
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    loaded = config_from_trace(task.settings, "configuration")
    return task.config, task.replication, task.engine(task.workload, loaded)


def plan(
    source: PlanInput,
    varies: Sequence[Vary],
    slo: Slo,
    *,
    replications: int,
    seed: int = 0,
    workers: int = 1,
    engine: Engine = DEFAULT_ENGINE,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Simulate every configuration on every replication; the table and the answer.

    ``progress`` is called with the number of tasks done and their total
    (first with none done). Errors in a
    configuration (a value it refuses) are raised before anything runs.
    """
    combos = settings(varies)
    header_config = source.workload.header.config
    configs = [config_as_json(configure(header_config, varies, s).config) for s in combos]
    # A plan changes the configuration: a recorded reload would put the old one back.
    workloads = [
        _without_reloads(replication(source, number, seed)) for number in range(replications)
    ]
    tasks = [
        _Task(c, r, workloads[r], configs[c], engine)
        for c in range(len(configs))
        for r in range(replications)
    ]
    results: dict[tuple[int, int], Metrics] = {}
    if progress is not None:
        progress(0, len(tasks))
    if workers <= 1:
        for task in tasks:
            c, r, metrics = _simulate(task)
            results[c, r] = metrics
            if progress is not None:
                progress(len(results), len(tasks))
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            for future in as_completed([pool.submit(_simulate, task) for task in tasks]):
                c, r, metrics = future.result()
                results[c, r] = metrics
                if progress is not None:
                    progress(len(results), len(tasks))
    rows = collect(combos, results, replications, slo)
    smallest = next((row for row in rows if row.meets), None)
    return PlanResult(rows, smallest, slo, replications, seed, source.kind)


def collect(
    combos: Sequence[Setting],
    results: Mapping[tuple[int, int], Metrics],
    replications: int,
    slo: Slo,
) -> tuple[Row, ...]:
    """Each configuration's row from results filed by (configuration, replication).

    Values are taken in replication order, never in the order they came in.
    """
    rows = []
    for c, setting in enumerate(combos):
        measured = [results[c, r] for r in range(replications)]
        estimates = {name: estimate([m.get(name) for m in measured]) for name in METRICS}
        rows.append(Row(setting, estimates, slo.met_by(estimates)))
    return tuple(rows)


def _without_reloads(workload: Workload) -> Workload:
    return attrs.evolve(
        workload, arrivals=tuple(a for a in workload.arrivals if a.kind != "reload")
    )
