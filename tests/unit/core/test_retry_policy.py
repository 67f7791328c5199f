"""The retry policy's rules, and its deterministic jitter, in plain examples."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from herdsman.core import Limits, RunRequest
from herdsman.core.lifecycle import Lifecycle, Settings, Withdrawal
from herdsman.core.outcome import Outcome, RunOutcome, RunStatus
from herdsman.core.retry import Failure, RetryPolicy, jitter_fraction

POLICY = RetryPolicy(3, frozenset({Failure.OVERLOADED, Failure.CRASH}), frozenset({Failure.CRASH}))


def test_the_jitter_is_blake2b_of_the_run_id_and_attempt_as_documented() -> None:
    digest = hashlib.blake2b(b"run-1\x002", digest_size=8).digest()
    assert jitter_fraction("run-1", 2) == int.from_bytes(digest, "big") / 2**64
    assert jitter_fraction("run-1", 2) != jitter_fraction("run-1", 3)
    assert jitter_fraction("run-1", 2) != jitter_fraction("run-2", 2)


@given(run_id=st.text(max_size=20), attempt=st.integers(1, 40))
def test_every_delay_is_between_half_and_all_of_the_capped_doubling(
    run_id: str, attempt: int
) -> None:
    policy = RetryPolicy(5, backoff=10.0, backoff_max=300.0)
    base = min(300.0, 10.0 * 2 ** (attempt - 1))
    delay = policy.delay(run_id, attempt)
    assert base / 2 <= delay <= base
    assert delay == policy.delay(run_id, attempt)  # the same run and attempt wait the same


def test_which_attempts_retry() -> None:
    assert POLICY.retries(Failure.OVERLOADED, 1, worked=False)
    assert POLICY.retries(Failure.OVERLOADED, 2, worked=False)
    assert not POLICY.retries(Failure.OVERLOADED, 3, worked=False)  # the third is the last
    assert not POLICY.retries(Failure.OVERLOADED, 1, worked=True)  # not after work
    assert POLICY.retries(Failure.CRASH, 1, worked=True)  # unless the class says so
    assert not POLICY.retries(Failure.RATE_LIMIT, 1, worked=False)  # not a class it retries


def test_a_backoff_holds_the_lane_frees_the_slot_and_wakes_the_driver() -> None:
    life = Lifecycle(Settings(Limits({"p": 1}), accounts={"p": ()}, retries={"p": POLICY}))
    first, later, other = RunRequest("a", "p", "c"), RunRequest("b", "p", "c"), RunRequest("x", "p")
    for run in (first, later, other):
        life.submit(run, 0.0)
    assert list(life.take_starts(0.0)) == ["a"]
    settled = life.finish("a", RunOutcome(Outcome.FAILED, 1, failure=Failure.OVERLOADED), 5.0)
    assert settled.retry is not None
    assert (settled.status, settled.retry.attempt) == (RunStatus.FAILED, 1)
    at = settled.retry.at
    assert life.next_wakeup(5.0) == at
    # Its slot goes to another lane; its own lane waits for it.
    assert list(life.take_starts(5.0)) == ["x"]
    life.finish("x", RunOutcome(Outcome.SUCCEEDED, 0), 6.0)
    assert not life.take_starts(at - 0.001)
    assert list(life.take_starts(at)) == ["a"]
    second = life.finish("a", RunOutcome(Outcome.FAILED, 1, failure=Failure.OVERLOADED), at + 1)
    assert second.retry is not None
    assert second.retry.attempt == 2
    assert list(life.take_starts(second.retry.at)) == ["a"]
    third = life.finish("a", RunOutcome(Outcome.FAILED, 1, failure=Failure.OVERLOADED), at + 9)
    assert third.retry is None  # attempts = 3
    assert list(life.take_starts(at + 9)) == ["b"]


def test_a_cancel_during_the_backoff_withdraws_the_run() -> None:
    life = Lifecycle(Settings(Limits({"p": 1}), accounts={"p": ()}, retries={"p": POLICY}))
    life.submit(RunRequest("a", "p", "c"), 0.0)
    life.submit(RunRequest("b", "p", "c"), 0.0)
    life.take_starts(0.0)
    life.finish("a", RunOutcome(Outcome.FAILED, 1, failure=Failure.CRASH), 1.0)
    assert life.cancel("a") is Withdrawal.WITHDRAWN
    assert life.next_wakeup(1.0) is None
    assert list(life.take_starts(1.0)) == ["b"]
