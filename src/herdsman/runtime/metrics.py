"""Prometheus metrics of one supervisor, in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from herdsman.runtime.runner.run_usage import Tokens
from herdsman.runtime.store.records import Spend
from herdsman.runtime.thread_calls import thread_usage

#: Per provider: (queued, running), read when /metrics is scraped.
QueueCounts = Callable[[], Mapping[str, tuple[int, int]]]

# Agent runs take seconds to hours; queue waits from milliseconds to hours.
_WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 14400)
_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)


class _QueueCollector(Collector):
    """Queued and running runs per provider, computed at scrape time.

    Reading the scheduler's counters when scraped costs nothing per event,
    where keeping gauges up to date cost a label lookup per provider on
    every submit, start and finish.
    """

    def __init__(self, counts: QueueCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queued = GaugeMetricFamily(
            "herdsman_queued_runs", "Runs waiting to start", labels=["provider"]
        )
        running = GaugeMetricFamily("herdsman_running_runs", "Runs executing", labels=["provider"])
        for provider, (waiting, executing) in sorted(self._counts().items()):
            queued.add_metric([provider], waiting)
            running.add_metric([provider], executing)
        yield queued
        yield running


class _ThreadCollector(Collector):
    """Calls, CPU and wall time of the worker-thread pools (spawns, commits), when scraped."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        cpu = CounterMetricFamily(
            "herdsman_worker_thread_cpu_seconds",
            "CPU time the calls of a pool used in worker threads, in this process",
            labels=["pool"],
        )
        busy = CounterMetricFamily(
            "herdsman_worker_thread_seconds",
            "Time the calls of a pool took in worker threads, waits for the GIL or a CPU included",
            labels=["pool"],
        )
        calls = CounterMetricFamily(
            "herdsman_worker_thread_calls", "Calls a pool made in worker threads", labels=["pool"]
        )
        for pool, usage in thread_usage().items():
            cpu.add_metric([pool], usage.cpu_seconds)
            busy.add_metric([pool], usage.seconds)
            calls.add_metric([pool], usage.calls)
        yield cpu
        yield busy
        yield calls


class _Children(dict[Any, Any]):
    """A labelled metric's children by label value, each looked up once.

    ``labels(...)`` validates and joins its arguments and takes a lock on
    every call; the supervisor counts several events per run, always with
    the same few label values, so each child is kept once found. Keyed by
    the one label value, or a tuple of them for a metric with several
    labels. A dict that looks up what it lacks (``__missing__``): a kept
    child is a plain subscript away, not a Python call (about 1,500
    instructions less per count). Children are never removed from these
    metrics, so a kept one stays the one that is exported.
    """

    __slots__ = ("_metric",)

    def __init__(self, metric: MetricWrapperBase) -> None:
        super().__init__()
        self._metric = metric

    def __missing__(self, key: str | tuple[str, ...]) -> Any:
        values = key if isinstance(key, tuple) else (key,)
        child = self[key] = self._metric.labels(*values)
        return child


class Metrics:
    """Counters, gauges and histograms the API serves at ``GET /metrics``.

    The supervisor counts through the ``count_*`` and ``observe_*`` methods,
    which keep each labelled child once looked up (see :class:`_Children`).
    """

    #: Whether the run counts (``count_*``, ``observe_duration``) count
    #: anything: a supervisor whose metrics do not leaves those calls out.
    counts_runs: ClassVar[bool] = True

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.submitted = Counter(
            "herdsman_runs_submitted", "Runs accepted", ["provider"], registry=r
        )
        self.started = Counter("herdsman_runs_started", "Runs started", ["provider"], registry=r)
        self.finished = Counter(
            "herdsman_runs_finished", "Runs finished", ["provider", "outcome"], registry=r
        )
        self.queue_wait = Histogram(
            "herdsman_queue_wait_seconds",
            "Time from submit to start",
            ["provider"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.run_duration = Histogram(
            "herdsman_run_duration_seconds",
            "Time from start to finish",
            ["provider"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.config_generation = Gauge(
            "herdsman_config_generation", "Generation of the applied config", registry=r
        )
        self.last_reload_ok = Gauge(
            "herdsman_config_last_reload_successful",
            "1 if the last reload applied, 0 if it was rejected",
            registry=r,
        )
        self.last_reload_time = Gauge(
            "herdsman_config_last_reload_timestamp_seconds",
            "Unix time of the last reload attempt",
            registry=r,
        )
        # What runs spent, as their agents' streams reported it. ``account``
        # "" is the provider's ambient environment; ``model`` "" the tokens
        # of a run whose stream named no model.
        self.tokens = Counter(
            "herdsman_tokens",
            "Tokens runs consumed, by kind (input, cache_read, cache_write, output)",
            ["provider", "account", "model", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "herdsman_cost_usd",
            "What runs cost in US dollars, as their providers' streams stated it",
            ["provider", "account", "model"],
            registry=r,
        )
        self.last_reload_ok.set(1)
        r.register(_ThreadCollector())
        self._submitted = _Children(self.submitted)
        self._started = _Children(self.started)
        self._finished = _Children(self.finished)
        self._queue_wait = _Children(self.queue_wait)
        self._run_duration = _Children(self.run_duration)
        self._tokens = _Children(self.tokens)
        self._cost = _Children(self.cost)

    def count_submit(self, provider: str) -> None:
        """One run of ``provider`` accepted."""
        self._submitted[provider].inc()

    def count_start(self, provider: str, waited: float) -> None:
        """One run of ``provider`` started after waiting ``waited`` seconds in the queue."""
        self._started[provider].inc()
        self._queue_wait[provider].observe(waited)

    def count_finish(self, provider: str, outcome: str) -> None:
        """One run of ``provider`` ended with ``outcome`` (a run status)."""
        self._finished[provider, outcome].inc()

    def observe_duration(self, provider: str, seconds: float) -> None:
        """A run of ``provider`` ran ``seconds`` from start to finish."""
        self._run_duration[provider].observe(seconds)

    def count_spend(self, provider: str, account: str | None, spend: Spend) -> None:
        """What a run of ``provider`` on ``account`` spent: tokens by kind, and cost.

        By model where the stream broke it down so; else under model "".
        Reasoning tokens are part of output and not counted again.
        """
        where = (provider, account or "")
        if spend.models:
            for model in spend.models:
                self._count(where, model.model, model.tokens, model.cost_usd)
        elif spend.tokens is not None or spend.cost_usd is not None:
            self._count(where, "", spend.tokens, spend.cost_usd)

    def _count(
        self, where: tuple[str, str], model: str, tokens: Tokens | None, cost: float | None
    ) -> None:
        if tokens is not None:
            for kind, amount in (
                ("input", tokens.input),
                ("cache_read", tokens.cache_read),
                ("cache_write", tokens.cache_write),
                ("output", tokens.output),
            ):
                if amount:
                    self._tokens[(*where, model, kind)].inc(amount)
        if cost is not None:
            self._cost[(*where, model)].inc(cost)

    def watch_queue(self, counts: QueueCounts) -> None:
        """Report queued and running runs per provider from ``counts`` at each scrape."""
        self.registry.register(_QueueCollector(counts))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class Uncounted(Metrics):
    """Metrics that leave runs uncounted, for a supervisor nobody scrapes.

    The simulator's replay runs the real supervisor but serves no
    ``/metrics``, and nothing in it reads these counters; counting a run's
    submit, start and finish in ``prometheus_client`` (a lock and checks per
    update) cost about a twentieth of a replayed run. The gauges (the
    configuration's generation and reloads) and the scrape-time collectors
    stay as :class:`Metrics` has them: they change only with the
    configuration.
    """

    #: The supervisor does not even call the run counts below (four calls
    #: of nothing, and their arguments worked out, a run).
    counts_runs: ClassVar[bool] = False

    def count_submit(self, provider: str) -> None:
        """Nothing: runs are not counted."""

    def count_start(self, provider: str, waited: float) -> None:
        """Nothing: runs are not counted."""

    def count_finish(self, provider: str, outcome: str) -> None:
        """Nothing: runs are not counted."""

    def observe_duration(self, provider: str, seconds: float) -> None:
        """Nothing: runs are not counted."""

    def count_spend(self, provider: str, account: str | None, spend: Spend) -> None:
        """Nothing: runs are not counted."""
