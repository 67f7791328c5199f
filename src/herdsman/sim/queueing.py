"""Queueing theory to check the simulator against: the M/M/c queue and the Erlang C formula.

With Poisson arrivals, exponential durations, every run on a lane of its own
and ``c`` slots, herdsman's scheduler is a first-come-first-served M/M/c
queue, whose probability of waiting and mean wait are known in closed form.
``docs/capacity-planning.md`` shows how closely the fast engine agrees, and
where the two part ways (lanes, agent exclusivity and quotas).
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence
from pathlib import Path

import attrs

from herdsman.config import LoadedConfig, load_config_text
from herdsman.config.report import config_as_json
from herdsman.sim.engine import FastEngine
from herdsman.sim.workload import Arrival, Attempt, RunPlan, Workload, config_from_trace
from herdsman.trace import TraceHeader, format_time

__all__ = [
    "MeasuredQueue",
    "erlang_c",
    "measure_mmc",
    "mmc_arrivals",
    "mmc_mean_wait",
    "mmc_workload",
]

#: Where simulated M/M/c traces begin (a whole second: sums with it stay exact).
EPOCH = 1_795_000_000.0


def erlang_c(servers: int, offered: float) -> float:
    """The probability that an arrival waits in an M/M/c queue (Erlang's C formula).

    ``offered`` is the load in erlangs, arrival rate over service rate; it
    must be below ``servers`` (else the queue grows without bound).

    C(c, a) = B(c, a) / (1 - (a/c) (1 - B(c, a))), where Erlang's B formula
    comes from the recursion B(0, a) = 1, B(k, a) = a B(k-1, a) / (k + a B(k-1, a)),
    which never forms the huge a^c / c! of the textbook form. References:
    L. Kleinrock, *Queueing Systems, Volume 1: Theory* (Wiley, 1975), section
    3.5 (the M/M/m queue, "Erlang's C formula"); D. Gross, C. M. Harris,
    *Fundamentals of Queueing Theory*, 3rd ed. (Wiley, 1998), section 2.3.
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, got {servers}")
    if not 0 < offered < servers:
        raise ValueError(f"offered load must be in (0, {servers}) erlangs, got {offered}")
    blocking = 1.0
    for k in range(1, servers + 1):
        blocking = offered * blocking / (k + offered * blocking)
    utilisation = offered / servers
    return blocking / (1 - utilisation * (1 - blocking))


def mmc_mean_wait(servers: int, arrival_rate: float, service_rate: float) -> float:
    """The mean time an arrival waits before it starts: C(c, a) / (c mu - lambda)."""
    offered = arrival_rate / service_rate
    return erlang_c(servers, offered) / (servers * service_rate - arrival_rate)


def mmc_arrivals(
    runs: int, servers: int, utilisation: float, *, mean_duration: float = 1.0, seed: int = 1
) -> list[tuple[float, float]]:
    """(arrival time, duration) of ``runs`` runs of an M/M/c queue, from a seeded generator."""
    rng = random.Random(seed)
    rate = utilisation * servers / mean_duration
    t, out = 0.0, []
    for _ in range(runs):
        t += rng.expovariate(rate)
        out.append((t, rng.expovariate(1 / mean_duration)))
    return out


def mmc_workload(
    items: Sequence[tuple[float, float]], servers: int, *, conversations: int = 0, seed: int = 1
) -> tuple[Workload, LoadedConfig]:
    """The runs as a workload: one provider with ``servers`` slots, no accounts.

    Every run is on a lane of its own, unless ``conversations`` is given:
    then each run joins one of that many conversations, picked at random
    (seeded), and runs of one conversation never overlap — no longer M/M/c.
    """
    rng = random.Random(seed)
    text = (
        f'[supervisor]\nstate_dir = "/sim"\n[providers.p]\nexec = ["p"]\nconcurrency = {servers}\n'
    )
    loaded = load_config_text(text, Path("/sim/supervisor.toml"), environ={})
    config = config_as_json(loaded.config)
    arrivals = []
    plans = {}
    for index, (at, duration) in enumerate(items):
        run_id = f"r{index}"
        run = {"id": run_id, "provider": "p"}
        if conversations:
            run["conversation"] = f"c{rng.randrange(conversations)}"
        arrivals.append(Arrival(at, "submit", {"run": run}))
        plans[run_id] = RunPlan(index, [Attempt(duration, "succeeded", 0)], synthetic=True)
    started = format_time(dt.datetime.fromtimestamp(EPOCH, dt.UTC))
    header = TraceHeader(1, started, config, None)
    workload = Workload(header, EPOCH, tuple(arrivals), plans)
    return workload, config_from_trace(config, "M/M/c")


@attrs.frozen
class MeasuredQueue:
    """What a simulation of an M/M/c queue measured, next to what Erlang C predicts."""

    servers: int
    utilisation: float
    runs: int
    mean_wait: float
    waiting_share: float
    expected_wait: float
    expected_share: float

    @property
    def wait_error(self) -> float:
        """Relative error of the mean wait (0.01 is 1%)."""
        return self.mean_wait / self.expected_wait - 1

    @property
    def share_error(self) -> float:
        """Relative error of the probability of waiting."""
        return self.waiting_share / self.expected_share - 1


def measure_mmc(
    servers: int,
    utilisation: float,
    runs: int,
    *,
    seed: int = 1,
    mean_duration: float = 1.0,
    conversations: int = 0,
) -> MeasuredQueue:
    """Simulate ``runs`` runs of an M/M/c queue with the fast engine; measure its waits.

    With ``conversations``, the same arrivals on that many conversations
    (see :func:`mmc_workload`): what Erlang C cannot model.
    """
    items = mmc_arrivals(runs, servers, utilisation, mean_duration=mean_duration, seed=seed)
    workload, loaded = mmc_workload(items, servers, conversations=conversations, seed=seed)
    engine = FastEngine(workload, loaded, trace=False, waits=True)
    engine.run()
    waits = engine.waits
    assert waits is not None  # asked for above
    arrival_rate = utilisation * servers / mean_duration
    return MeasuredQueue(
        servers=servers,
        utilisation=utilisation,
        runs=runs,
        mean_wait=sum(waits) / runs,
        waiting_share=sum(1 for wait in waits if wait > 0) / runs,
        expected_wait=mmc_mean_wait(servers, arrival_rate, 1 / mean_duration),
        expected_share=erlang_c(servers, utilisation * servers),
    )
