"""ddmin keeps a failing subsequence from which no single item can go."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from herdsman.sim.fuzz.minimise import ddmin


@st.composite
def _inputs(draw: st.DrawFn) -> tuple[list[int], set[int]]:
    """Items, and the culprits among them that together make it fail."""
    size = draw(st.integers(1, 60))
    culprits = draw(st.sets(st.integers(0, size - 1), min_size=1, max_size=4))
    return list(range(size)), culprits


@given(_inputs())
def test_a_monotone_failure_shrinks_to_exactly_its_culprits(
    case: tuple[list[int], set[int]],
) -> None:
    items, culprits = case
    calls: list[list[int]] = []

    def fails(kept: list[int]) -> bool:
        calls.append(kept)
        return culprits <= set(kept)

    found = ddmin(items, fails, budget=10_000)
    assert found.complete
    assert [items[i] for i in found.indices] == sorted(culprits)
    assert found.tries == len({tuple(kept) for kept in calls}) == len(calls)


@given(_inputs(), st.integers(1, 8))
def test_a_spent_budget_still_returns_a_failing_subsequence(
    case: tuple[list[int], set[int]], budget: int
) -> None:
    items, culprits = case
    found = ddmin(items, lambda kept: culprits <= set(kept), budget=budget)
    kept = [items[i] for i in found.indices]
    assert culprits <= set(kept)
    assert kept == sorted(kept)  # the order is kept
    assert found.tries <= budget


@given(st.lists(st.integers(0, 3), min_size=1, max_size=30))
def test_a_failure_that_needs_two_of_a_kind_keeps_one_pair(items: list[int]) -> None:
    # Not monotone in which items: any two equal values fail.
    def fails(kept: list[int]) -> bool:
        return len(kept) != len(set(kept))

    assume(fails(items))
    found = ddmin(items, fails, budget=10_000)
    kept = [items[i] for i in found.indices]
    assert len(kept) == 2
    assert kept[0] == kept[1]
