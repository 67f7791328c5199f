"""KeyClaims: counts equal a from-scratch count of the claims outstanding; cost per key named."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st
from line_cost import lines_run

import herdsman.core.key_claims as key_claims_module
from herdsman.core import KeyClaims

KEYS = ("conversation:default/c0", "conversation:default/c1", "agent:w/a0", "agent:w/a1")

# Each step: claim a batch (a list of keys, maybe repeating one), or release
# the outstanding batch at an index (modulo how many there are).
step_st = st.one_of(
    st.tuples(st.just("claim"), st.lists(st.sampled_from(KEYS), max_size=3)),
    st.tuples(st.just("release"), st.integers(min_value=0, max_value=20)),
)


@given(st.lists(step_st, max_size=40))
def test_counts_equal_a_count_of_the_batches_not_yet_released(
    steps: list[tuple[str, object]],
) -> None:
    claims = KeyClaims()
    outstanding: list[list[str]] = []
    for kind, arg in steps:
        if kind == "claim":
            assert isinstance(arg, list)
            claims.claim(arg)
            outstanding.append(arg)
        elif outstanding:
            assert isinstance(arg, int)
            claims.release(outstanding.pop(arg % len(outstanding)))
        expected = collections.Counter(key for batch in outstanding for key in batch)
        assert claims.counts() == dict(sorted(expected.items()))
        for key in KEYS:
            assert claims.claimed(key) is (expected[key] > 0), key


def test_a_release_without_its_claim_is_refused_and_changes_nothing() -> None:
    claims = KeyClaims()
    claims.claim(["k"])
    with pytest.raises(ValueError, match="key 'j' released more often than it was claimed"):
        claims.release(["j"])
    claims.release(["k"])
    with pytest.raises(ValueError, match="key 'k' released more often than it was claimed"):
        claims.release(["k"])
    assert claims.counts() == {}


def cost_of_one_submit(others: int) -> int:
    """Lines a claim, a check and a release of one key run with ``others`` keys claimed."""
    claims = KeyClaims()
    claims.claim(f"conversation:default/c{n}" for n in range(others))

    def submit() -> bool:
        claims.claim(["conversation:default/x"])
        busy = claims.claimed("conversation:default/x")
        claims.release(["conversation:default/x"])
        return busy

    lines, busy = lines_run((key_claims_module,), submit)
    assert busy
    return lines


def test_a_claim_and_its_release_cost_the_keys_named_not_the_keys_claimed_by_others() -> None:
    # The Counter this replaced was rebuilt whole (``+counter``) on every release.
    assert cost_of_one_submit(5_000) == cost_of_one_submit(3)
