"""Prometheus metrics of one supervisor, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Agent runs take seconds to hours; queue waits from milliseconds to hours.
_WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 14400)
_DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)


class Metrics:
    """Counters, gauges and histograms the API serves at ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queued = Gauge(
            "herdsman_queued_runs", "Runs waiting to start", ["provider"], registry=r
        )
        self.running = Gauge("herdsman_running_runs", "Runs executing", ["provider"], registry=r)
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

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
