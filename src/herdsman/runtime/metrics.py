"""Prometheus metrics of one supervisor, in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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


class Metrics:
    """Counters, gauges and histograms the API serves at ``GET /metrics``."""

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
        self.last_reload_ok.set(1)

    def watch_queue(self, counts: QueueCounts) -> None:
        """Report queued and running runs per provider from ``counts`` at each scrape."""
        self.registry.register(_QueueCollector(counts))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
