"""The fast engine agrees with queueing theory on the M/M/c queue (Erlang C)."""

from __future__ import annotations

import math

import pytest

from herdsman.sim.queueing import erlang_c, measure_mmc, mmc_mean_wait


def textbook_erlang_c(servers: int, offered: float) -> float:
    """The textbook form, factorials and all: a second, independent computation."""
    tail = offered**servers / math.factorial(servers) * servers / (servers - offered)
    head = sum(offered**k / math.factorial(k) for k in range(servers))
    return tail / (head + tail)


@pytest.mark.parametrize("servers", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("utilisation", [0.1, 0.5, 0.9, 0.99])
def test_erlang_c_matches_the_textbook_form(servers: int, utilisation: float) -> None:
    offered = servers * utilisation
    assert erlang_c(servers, offered) == pytest.approx(textbook_erlang_c(servers, offered))


def test_erlang_c_known_values() -> None:
    # M/M/1: an arrival waits exactly when the server is busy, with probability rho.
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    assert mmc_mean_wait(1, 0.7, 1.0) == pytest.approx(0.7 / (1.0 - 0.7))
    # M/M/2 at one erlang: (1/2 * 2) / (1 + 1 + 1).
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)


@pytest.mark.parametrize(("servers", "offered"), [(0, 0.5), (2, 2.0), (2, 0.0), (1, -1.0)])
def test_erlang_c_refuses_a_queue_without_a_steady_state(servers: int, offered: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        erlang_c(servers, offered)


def test_a_simulated_mmc_queue_waits_as_erlang_c_predicts() -> None:
    # Seeded, so the same every time; long enough that the error is a
    # quarter of the tolerance (docs/capacity-planning.md has the full table).
    measured = measure_mmc(2, 0.5, 60_000, seed=1)
    assert measured.runs == 60_000
    assert abs(measured.share_error) < 0.05, measured
    assert abs(measured.wait_error) < 0.05, measured
    # And the queue did queue: a quarter or more of the runs waited.
    assert measured.waiting_share > 0.25


def test_runs_of_few_conversations_wait_longer_than_erlang_c_says() -> None:
    # The same arrivals, on three conversations: a busy conversation holds
    # its next run back although a slot is free, which the formula ignores.
    alone = measure_mmc(2, 0.5, 20_000, seed=3)
    shared = measure_mmc(2, 0.5, 20_000, seed=3, conversations=3)
    assert shared.expected_wait == alone.expected_wait
    assert shared.mean_wait > 1.5 * alone.mean_wait
    assert shared.mean_wait > 1.5 * shared.expected_wait
