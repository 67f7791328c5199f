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

import contextlib
import logging
import multiprocessing
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import attrs

from herdsman.config import LoadedConfig
from herdsman.config.report import config_as_json
from herdsman.sim.collector import young_collections_rarer
from herdsman.sim.cost import Price, configuration_cost
from herdsman.sim.generate import (
    Samples,
    generate_workload,
    load_samples,
    recorded_durations,
)
from herdsman.sim.metrics import METRICS, SPEND_METRICS, Metrics, measure
from herdsman.sim.model import Model, ModelError, model_from_json
from herdsman.sim.slo import Slo, Verdict
from herdsman.sim.stats import Estimate, estimate, replications_to_decide
from herdsman.sim.sweep import Setting, Vary, configure, settings
from herdsman.sim.workload import (
    RunPlan,
    Workload,
    config_from_trace,
    read_workload_text,
)
from herdsman.trace import TraceFormatError

__all__ = [
    "DEFAULT_ENGINE",
    "Engine",
    "PlanInput",
    "PlanResult",
    "Replications",
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
    #: The file's text, which ``workload`` was read from: what a worker process is given.
    text: str = attrs.field(eq=False, repr=False)

    @property
    def kind(self) -> str:
        """``generated`` or ``recorded``."""
        return "generated" if self.model is not None else "recorded"


def read_input(path: Path) -> PlanInput:
    """Read ``path``; TraceFormatError or ModelError naming it if it is not usable."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read trace: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise TraceFormatError(
            f"{path}: not UTF-8 text (byte {exc.start} cannot be decoded): not a trace"
        ) from None
    with young_collections_rarer():  # reading keeps every arrival and attempt it makes
        workload = read_workload_text(text, str(path))
    generator = workload.header.generator
    if generator is None:
        return PlanInput(path, workload, None, None, Samples(), text)
    model = model_from_json(generator.get("model") or {}, f"{path}:1")
    seed = generator.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ModelError(f"{path}:1: generator.seed: expected a whole number, got {seed!r}")
    return PlanInput(path, workload, model, seed, _samples(path, model), text)


def _samples(path: Path, model: Model) -> Samples:
    """The recorded traces ``model`` resamples, read again; an error says why they are read."""
    try:
        return load_samples(model)
    except TraceFormatError as error:
        named = [t for t in (model.arrivals.trace, model.durations.trace) if t is not None]
        relative = [t for t in named if not Path(t).is_absolute()]
        where = (
            f"; {' and '.join(dict.fromkeys(relative))} is read from the folder sim plan runs"
            f" in ({Path.cwd()}): run sim plan in the folder sim generate ran in"
            if relative
            else ""
        )
        raise TraceFormatError(
            f"{path}:1: its model resamples {' and '.join(dict.fromkeys(named))}, read again"
            f" to draw each replication: {error}{where}"
        ) from None


def replication_seed(seed: int, replication: int) -> int:
    """The seed of a replication: from a string, which ``random`` hashes with SHA-512."""
    return random.Random(f"herdsman-plan:{seed}:{replication}").getrandbits(63)


def replication(source: PlanInput, number: int, seed: int) -> Workload:
    """Replication ``number`` of ``source`` (see the module docstring)."""
    if number == 0:
        return source.workload
    if source.model is not None:
        config = source.workload.header.config
        return _drawn(source.path, source.model, config, source.samples, number=number, seed=seed)
    drawn = replication_seed(seed, number)
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


def _drawn(
    path: Path, model: Model, config: Mapping[str, Any], samples: Samples, *, number: int, seed: int
) -> Workload:
    """Replication ``number`` >= 1 of the workload generated from ``model`` under ``config``."""
    name = f"{path} (replication {number})"
    return generate_workload(model, config, replication_seed(seed, number), samples, name)


#: ``--replications auto``: the first look, and the default cap.
AUTO_FIRST = 5
AUTO_CAP = 100
#: The confidence of a fixed number of replications' intervals, and the
#: overall level ``auto`` splits across its looks.
CONFIDENCE = 0.95


@attrs.frozen
class Replications:
    """How many replications: a fixed number, or ``auto`` looks up to a cap.

    ``auto`` is a group-sequential procedure (docs/capacity-planning.md):
    every configuration still undecided is given more replications at each
    look — 5, 10, 20, ... doubling, the last look at the cap — and stops
    at the first look whose interval puts every clause of the SLO on one
    side of its threshold. The 5% a single interval allows for error is
    split evenly across the looks (Bonferroni), so each look's interval is
    at 1 - 0.05/K for K looks.
    """

    looks: tuple[int, ...]
    auto: bool

    @classmethod
    def fixed(cls, count: int) -> Replications:
        """Exactly ``count`` replications, 95% intervals."""
        return cls((count,), auto=False)

    @classmethod
    def automatic(cls, cap: int = AUTO_CAP) -> Replications:
        """Looks at 5, 10, 20, ... and ``cap`` (at least 5)."""
        looks = [AUTO_FIRST]
        while looks[-1] * 2 < cap:
            looks.append(looks[-1] * 2)
        if looks[-1] < cap:
            looks.append(cap)
        return cls(tuple(looks), auto=True)

    @property
    def cap(self) -> int:
        """The most replications any configuration gets."""
        return self.looks[-1]

    @property
    def confidence(self) -> float:
        """Each interval's confidence: 95%, or 95% split across the looks."""
        return 1 - (1 - CONFIDENCE) / len(self.looks) if self.auto else CONFIDENCE


@attrs.frozen
class Row:
    """One configuration: its setting, each metric's estimate, and the SLO's verdict.

    ``replications`` is how many it was simulated on; ``cost`` its monthly
    cost (None without ``--cost``); ``settle`` for an undecided one, about
    how many replications would decide it (None when that cannot be told).
    """

    setting: Setting
    estimates: Mapping[str, Estimate]
    verdict: Verdict
    replications: int
    cost: float | None = None
    settle: int | None = None

    @property
    def meets(self) -> bool:
        """Whether its whole interval meets the SLO."""
        return self.verdict == "meets"


@attrs.frozen
class PlanResult:
    """Every configuration's row, in sweep order, and the answer.

    ``answer`` is the cheapest configuration meeting the SLO when priced
    (the first of equally cheap ones), else the first meeting it in sweep
    order; ``smallest`` is always the latter.
    """

    rows: tuple[Row, ...]
    answer: Row | None
    smallest: Row | None
    slo: Slo
    replications: Replications
    seed: int
    kind: str
    priced: bool = False

    @property
    def spent(self) -> tuple[str, ...]:
        """The spend metrics some configuration measured (none: the workload has no spend)."""
        return tuple(
            name for name in SPEND_METRICS if any(row.estimates[name].high > 0 for row in self.rows)
        )


@attrs.frozen
class _Job:
    """What every worker needs once: the input, configurations, seed and engine.

    The input goes as its text, with what its header says a generated
    workload's replications are drawn from, not as the workload read from
    it: a worker reads the text only when it needs the workload itself
    (replication 0, or any replication of a recorded trace). Pickling a
    month's 20,000 runs for each worker, and unpickling them in each, cost
    more than reading them (docs/capacity-planning.md).
    """

    path: Path
    text: str
    model: Model | None
    model_seed: int | None
    samples: Samples
    #: The header's configuration, which a generated workload's replications are drawn under.
    config: Mapping[str, Any]
    configs: tuple[Mapping[str, Any], ...]
    seed: int
    engine: Engine

    @classmethod
    def of(
        cls, source: PlanInput, configs: tuple[Mapping[str, Any], ...], seed: int, engine: Engine
    ) -> _Job:
        """The job of a plan of ``source``."""
        header = source.workload.header
        return cls(
            source.path,
            source.text,
            source.model,
            source.seed,
            source.samples,
            header.config,
            configs,
            seed,
            engine,
        )


class _Worker:
    """Runs simulations of one job, keeping the replication it built last.

    Tasks come replication by replication, so a worker builds (draws) a
    replication once for all the configurations it runs on it. ``source``:
    the input already read (in the process that read it), else read from
    the job's text the first time it is needed.
    """

    def __init__(self, job: _Job, source: PlanInput | None = None) -> None:
        self.job = job
        self._source = source
        self._loaded: dict[int, LoadedConfig] = {}
        self._built: tuple[int, Workload] | None = None

    def simulate(self, replication_number: int, configs: Sequence[int]) -> list[Metrics]:
        # Building keeps every arrival and attempt it makes, and so does the
        # engine: no cyclic garbage worth the default collector's full passes.
        with young_collections_rarer():
            if self._built is None or self._built[0] != replication_number:
                drawn = self._replication(replication_number)
                self._built = (replication_number, _as_planned(drawn))
            workload = self._built[1]
            return [self.job.engine(workload, self._config(c)) for c in configs]

    def _replication(self, number: int) -> Workload:
        job = self.job
        if number > 0 and job.model is not None:
            return _drawn(
                job.path, job.model, job.config, job.samples, number=number, seed=job.seed
            )
        if self._source is None:
            workload = read_workload_text(job.text, str(job.path))
            self._source = PlanInput(
                job.path, workload, job.model, job.model_seed, job.samples, job.text
            )
        return replication(self._source, number, job.seed)

    def _config(self, number: int) -> LoadedConfig:
        if number not in self._loaded:
            self._loaded[number] = config_from_trace(self.job.configs[number], "configuration")
        return self._loaded[number]


_WORKER: _Worker | None = None


def _start_worker(job: _Job) -> None:
    global _WORKER  # noqa: PLW0603 - one per worker process, set once by the pool
    # The simulated supervisor's log (usage limits, checkouts) is not news here.
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    _WORKER = _Worker(job)


def _run_task(task: tuple[int, tuple[int, ...]]) -> tuple[int, tuple[int, ...], list[Metrics]]:
    assert _WORKER is not None, "the pool's initializer sets the worker"
    number, configs = task
    return number, configs, _WORKER.simulate(number, configs)


def _tasks(batch: Mapping[int, Sequence[int]], workers: int) -> list[tuple[int, tuple[int, ...]]]:
    """Replication-major tasks: whole replications while every worker can have one.

    The replications left over once the rest are shared out evenly (fewer
    than ``workers``) are dealt out: each in ``workers`` tasks, one
    configuration in ``workers`` each, so no worker waits a whole replication
    for the last one to finish. Dealt, not cut in runs, since neighbouring
    configurations of a sweep cost about the same. Each worker builds such a
    replication for itself, which costs less than one simulation on it.
    """
    numbers = [number for number in sorted(batch) if batch[number]]
    whole = len(numbers) - len(numbers) % workers
    tasks = [(number, tuple(batch[number])) for number in numbers[:whole]]
    for number in numbers[whole:]:
        configs = tuple(batch[number])
        tasks += [(number, configs[i::workers]) for i in range(min(workers, len(configs)))]
    return tasks


def plan(
    source: PlanInput,
    varies: Sequence[Vary],
    slo: Slo,
    *,
    replications: int | Replications,
    seed: int = 0,
    workers: int = 1,
    engine: Engine = DEFAULT_ENGINE,
    progress: Callable[[int, int], None] | None = None,
    prices: Sequence[Price] = (),
) -> PlanResult:
    """Simulate every configuration on its replications; the table and the answer.

    ``progress`` is called with the number of simulations done and the
    number planned so far (first with none done; with ``auto`` the total
    grows at each look). Errors in a configuration (a value it refuses, a
    priced key without a number) are raised before anything runs.
    """
    spec = (
        replications if isinstance(replications, Replications) else Replications.fixed(replications)
    )
    combos = settings(varies)
    header_config = source.workload.header.config
    configs = tuple(config_as_json(configure(header_config, varies, s).config) for s in combos)
    costs = [
        configuration_cost(config, prices, "--vary " + _label(combo)) if prices else None
        for config, combo in zip(configs, combos, strict=True)
    ]
    job = _Job.of(source, configs, seed, engine)
    results: dict[tuple[int, int], Metrics] = {}
    undecided = list(range(len(configs)))
    used = dict.fromkeys(undecided, 0)
    planned = 0
    with _pool(job, workers, source) as run:
        for look in spec.looks:
            batch = {r: [c for c in undecided if used[c] <= r] for r in range(look)}
            planned += sum(len(configs) for configs in batch.values())
            if progress is not None:
                progress(len(results), planned)

            def tick(total: int = planned) -> None:
                if progress is not None:
                    progress(len(results), total)

            run(_tasks(batch, workers), results, tick)
            for c in undecided:
                used[c] = look
            undecided = [
                c
                for c in undecided
                if slo.verdict(_estimates(c, results, look, spec.confidence)) == "undecided"
            ]
            if not undecided:
                break
    rows = tuple(
        _row(combos[c], c, results, used[c], slo=slo, spec=spec, cost=costs[c])
        for c in range(len(combos))
    )
    meeting = [row for row in rows if row.meets]
    smallest = meeting[0] if meeting else None
    answer = smallest
    if prices and meeting:
        answer = min(meeting, key=lambda row: row.cost or 0.0)  # min keeps the first of ties
    return PlanResult(rows, answer, smallest, slo, spec, seed, source.kind, bool(prices))


_Run = Callable[
    [list[tuple[int, tuple[int, ...]]], dict[tuple[int, int], Metrics], Callable[[], object]],
    None,
]


@contextlib.contextmanager
def _pool(job: _Job, workers: int, source: PlanInput) -> Iterator[_Run]:
    """Something that runs tasks and files each result under (configuration, replication).

    Nothing is taken in the order workers finish: the results are the same
    for any number of workers.
    """
    if workers <= 1:
        logging.getLogger("herdsman").setLevel(logging.ERROR)
        worker = _Worker(job, source)

        def run_here(tasks: Any, results: Any, tick: Any) -> None:
            for number, configs in tasks:
                for c, metrics in zip(configs, worker.simulate(number, configs), strict=True):
                    results[c, number] = metrics
                    tick()

        yield run_here
        return
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_start_worker, initargs=(job,)
    ) as executor:

        def run_there(tasks: Any, results: Any, tick: Any) -> None:
            for future in as_completed([executor.submit(_run_task, task) for task in tasks]):
                number, configs, measured = future.result()
                for c, metrics in zip(configs, measured, strict=True):
                    results[c, number] = metrics
                tick()

        yield run_there


def _estimates(
    c: int, results: Mapping[tuple[int, int], Metrics], count: int, confidence: float
) -> dict[str, Estimate]:
    # Values in replication order, never in the order they came in.
    measured = [results[c, r] for r in range(count)]
    return {name: estimate([m.get(name) for m in measured], confidence) for name in METRICS}


def _row(
    setting: Setting,
    c: int,
    results: Mapping[tuple[int, int], Metrics],
    count: int,
    *,
    slo: Slo,
    spec: Replications,
    cost: float | None,
) -> Row:
    estimates = _estimates(c, results, count, spec.confidence)
    verdict = slo.verdict(estimates)
    settle = None
    if verdict == "undecided":
        needs = [
            replications_to_decide(estimates[clause.metric].values, clause.value, spec.confidence)
            for clause in slo.clauses
            if clause.verdict(estimates[clause.metric]) == "undecided"
        ]
        if all(n is not None for n in needs):
            settle = max(count + 1, *(n for n in needs if n is not None))
    return Row(setting, estimates, verdict, count, cost, settle)


def collect(
    combos: Sequence[Setting],
    results: Mapping[tuple[int, int], Metrics],
    replications: int,
    slo: Slo,
) -> tuple[Row, ...]:
    """Each configuration's row from results filed by (configuration, replication).

    Values are taken in replication order, never in the order they came in.
    """
    spec = Replications.fixed(replications)
    return tuple(
        _row(setting, c, results, replications, slo=slo, spec=spec, cost=None)
        for c, setting in enumerate(combos)
    )


def _label(setting: Setting) -> str:
    return " ".join(f"{key}={value}" for key, value in setting)


#: Recorded arrivals a plan leaves out. A plan changes the configuration: a
#: recorded reload would put the old one back. A plan asks how a
#: configuration serves the runs: a recorded shutdown would stop starts and
#: leave the runs queued then unstarted, with no wait, so a smaller
#: configuration would look better than it is.
_NOT_PLANNED = frozenset({"reload", "shutdown"})


def _as_planned(workload: Workload) -> Workload:
    """The workload without the arrivals a plan leaves out (:data:`_NOT_PLANNED`)."""
    return attrs.evolve(
        workload, arrivals=tuple(a for a in workload.arrivals if a.kind not in _NOT_PLANNED)
    )
