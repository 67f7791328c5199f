"""What a plan measures in one simulated trace: waits, utilisation, throughput, limits.

* **wait**: the time a run spent queued — from its submit to its start,
  plus, after a usage limit re-queued it, from then to its next start (one
  value per run); percentiles by nearest rank. Runs never started (their
  provider missing, no account that could ever take them, or a replayed
  shutdown first) have
  no wait and are counted in ``unstarted``; runs cancelled while queued are
  in neither.
* **utilisation**: run-seconds spent running (each attempt, start to finish)
  over slot-seconds available: the slots are the sum of the providers'
  ``concurrency``, capped by ``supervisor.max_concurrency``, over the time
  from 0 to the trace's last event.
* **throughput**: runs that ended (re-queued attempts excepted) per hour of
  that same time.
* **usage_limited**: ``usage_limit`` events (each rests an account);
  **timeouts**: runs that ended ``timed_out``.
* **spend** — what the agents burn, as the finish events' ``spend`` says
  (a workload with a spend model, docs/simulator.md), not what
  ``--cost`` prices (the configuration): **tokens_per_day** and
  **spend_per_day** (US dollars), over the same time as throughput in days,
  but at least one (a workload shorter than a day spends its all in its
  day); **tokens_per_run** and **spend_per_run**, over the runs that ended.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from herdsman.trace import read_trace_text

__all__ = ["METRICS", "SPEND_METRICS", "Metrics", "figures", "measure", "percentile", "slots_of"]

#: Metric names, in the order tables show them, and their units.
METRICS: Mapping[str, str] = {
    "p50_wait": "s",
    "p95_wait": "s",
    "p99_wait": "s",
    "mean_wait": "s",
    "utilisation": "",
    "throughput": "/h",
    "usage_limited": "",
    "timeouts": "",
    "unstarted": "",
    "spend_per_day": "$/day",
    "tokens_per_day": "tokens/day",
    "spend_per_run": "$/run",
    "tokens_per_run": "tokens/run",
}

#: The metrics of what the agents spent (all 0 for a workload without a spend model).
SPEND_METRICS = ("spend_per_day", "tokens_per_day", "spend_per_run", "tokens_per_run")


@attrs.frozen
class Metrics:
    """One simulated trace's figures (see the module docstring for definitions)."""

    p50_wait: float
    p95_wait: float
    p99_wait: float
    mean_wait: float
    utilisation: float
    throughput: float
    usage_limited: float
    timeouts: float
    unstarted: float
    tokens_per_day: float = 0.0
    spend_per_day: float = 0.0
    tokens_per_run: float = 0.0
    spend_per_run: float = 0.0

    def get(self, name: str) -> float:
        """The metric called ``name`` (one of :data:`METRICS`)."""
        value: float = getattr(self, name)
        return value


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``sorted_values`` (0 if empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def slots_of(config: Mapping[str, Any]) -> int:
    """Slots a configuration (as a trace header carries it) can run at once."""
    providers = config.get("providers") or {}
    slots = sum(int(p.get("concurrency") or 1) for p in providers.values())
    cap = (config.get("supervisor") or {}).get("max_concurrency")
    return min(slots, int(cap)) if cap else slots


def measure(trace: str) -> Metrics:
    """The metrics of the simulated ``trace`` text."""
    header, events = read_trace_text(trace, "(simulated trace)")
    submitted: dict[str, float] = {}
    started: set[str] = set()
    cancelled: set[str] = set()
    # A run waits from its submit to its start, and again from a usage
    # limit's re-queue to its next start: both are time its answer waited.
    queued_since: dict[str, float] = {}
    waited: dict[str, float] = {}
    running: dict[str, float] = {}
    busy = 0.0
    ended = timeouts = limits = tokens = 0
    usd = end = 0.0
    for event in events:
        end = event.t
        fields = event.fields
        if event.event == "submit":
            run_id = fields["run"]["id"]
            if run_id not in submitted:
                submitted[run_id] = queued_since[run_id] = event.t
        elif event.event == "start":
            run_id = fields["run_id"]
            started.add(run_id)
            since = queued_since.pop(run_id, event.t)
            waited[run_id] = waited.get(run_id, 0.0) + event.t - since
            running[run_id] = event.t
        elif event.event == "finish":
            began = running.pop(fields["run_id"], None)
            if began is not None:
                busy += event.t - began
            if fields.get("requeued"):
                queued_since[fields["run_id"]] = event.t
            else:
                ended += 1
                timeouts += fields["outcome"] == "timed_out"
            spend = fields.get("spend")
            if spend is not None:
                if spend["tokens"] is not None:
                    tokens += spend["tokens"]["total"]
                if spend["cost_usd"] is not None:
                    usd += spend["cost_usd"]
        elif event.event == "cancel":  # withdrawn while queued: not left unstarted
            cancelled.add(fields["run_id"])
        elif event.event == "usage_limit":
            limits += 1
    unstarted = sum(1 for run in submitted if run not in started and run not in cancelled)
    return figures(
        list(waited.values()),
        busy=busy,
        end=end,
        slots=slots_of(header.config),
        ended=ended,
        usage_limited=limits,
        timeouts=timeouts,
        unstarted=unstarted,
        tokens=tokens,
        usd=usd,
    )


def figures(
    waits: list[float],
    *,
    busy: float,
    end: float,
    slots: int,
    ended: int,
    usage_limited: int,
    timeouts: int,
    unstarted: int,
    tokens: int = 0,
    usd: float = 0.0,
) -> Metrics:
    """The metrics from what a trace adds up to (see the module docstring).

    ``waits``: each started run's wait, in any order (sorted here);
    ``busy``: run-seconds spent running; ``end``: the last event's time;
    ``ended``: runs that ended for good; ``tokens`` and ``usd``: what their
    finishes say the agents spent. :func:`measure` adds these up from
    a trace's text, the fast engine as it goes (``FastEngine.metrics``).
    """
    waits.sort()
    # At least a day: a workload of one working day spends that day's spend
    # in a day, not 24/8 of it (and a slower configuration's longer tail
    # does not make a day of it cheaper).
    days = max(1.0, end / 86400)
    return Metrics(
        p50_wait=percentile(waits, 50),
        p95_wait=percentile(waits, 95),
        p99_wait=percentile(waits, 99),
        mean_wait=math.fsum(waits) / len(waits) if waits else 0.0,
        utilisation=busy / (slots * end) if end > 0 and slots else 0.0,
        throughput=ended / (end / 3600) if end > 0 else 0.0,
        usage_limited=float(usage_limited),
        timeouts=float(timeouts),
        unstarted=float(unstarted),
        tokens_per_day=tokens / days,
        spend_per_day=usd / days,
        tokens_per_run=tokens / ended if ended else 0.0,
        spend_per_run=usd / ended if ended else 0.0,
    )
