"""An account's answers at one moment follow every change made at that moment.

The book keeps what an account can take (its usage, and why it cannot take
a run) from one question to the next at the same time, since one start asks
it several times; each test changes the account at that very moment and
checks the next answer sees it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from herdsman.core.accounts import AccountBook, AccountSpec, Elsewhere

T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock
HOUR = 3600.0


def test_a_start_at_the_same_moment_fills_a_concurrency_cap() -> None:
    book = AccountBook({"claude": [AccountSpec("a", concurrency=1)]})
    assert book.available("claude", T0)
    book.start("r1", "claude", "a", T0)
    assert not book.available("claude", T0)
    book.finish("r1", T0)
    assert book.available("claude", T0)


def test_a_start_at_the_same_moment_spends_the_budget() -> None:
    book = AccountBook({"claude": [AccountSpec("a", window=HOUR, budget=2)]})
    book.start("r1", "claude", "a", T0)
    assert book.statuses(T0)[0].usage == 1.0
    book.start("r2", "claude", "a", T0)
    assert book.statuses(T0)[0].usage == 2.0
    assert not book.available("claude", T0)
    assert book.next_change("claude", T0) == T0 + HOUR


def test_a_start_given_back_at_the_same_moment_frees_the_budget() -> None:
    book = AccountBook({"claude": [AccountSpec("a", window=HOUR, budget=1)]})
    book.start("r1", "claude", "a", T0)
    assert not book.available("claude", T0)
    book.finish("r1", T0, spawned=False)
    assert book.available("claude", T0)


def test_a_rest_and_its_end_at_the_same_moment() -> None:
    book = AccountBook({"claude": [AccountSpec("a")]})
    assert book.available("claude", T0)
    book.rest("claude", "a", T0 + 60, "limit")
    assert not book.available("claude", T0)
    book.wake("claude", "a")
    assert book.available("claude", T0)
    book.sync_rests([("claude", "a", T0 + 60, "limit elsewhere")], T0)
    assert not book.available("claude", T0)
    book.sync_rests([], T0)
    assert book.available("claude", T0)


def test_a_reload_at_the_same_moment_applies_the_new_limits() -> None:
    book = AccountBook({"claude": [AccountSpec("a", window=HOUR, budget=5)]})
    book.start("r1", "claude", "a", T0)
    assert book.available("claude", T0)
    book.configure("claude", [AccountSpec("a", window=HOUR, budget=1)])
    assert not book.available("claude", T0)


def test_usage_elsewhere_at_the_same_moment_counts() -> None:
    book = AccountBook({"claude": [AccountSpec("a", window=HOUR, budget=1)]})
    assert book.available("claude", T0)
    book.set_elsewhere([Elsewhere("claude", "a", T0 - 60, None)])
    assert not book.available("claude", T0)
    book.set_elsewhere([])
    assert book.available("claude", T0)


def test_restored_usage_at_the_same_moment_counts() -> None:
    book = AccountBook({"claude": [AccountSpec("a", window=HOUR, budget=1)]})
    assert book.available("claude", T0)
    book.restore_usage("claude", "a", T0 - 60, T0 - 30)
    assert not book.available("claude", T0)


# Operations at a handful of moments, so several land on one: (what, run, moment).
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["start", "finish", "unspawned", "rest", "wake"]),
        st.integers(0, 5),
        st.integers(0, 3),
    ),
    max_size=30,
)


def _book() -> AccountBook:
    return AccountBook({"claude": [AccountSpec("a", window=HOUR, budget=3, concurrency=2)]})


def _apply(book: AccountBook, running: set[int], op: tuple[str, int, int], now: float) -> None:
    what, run, _ = op
    if what == "start" and run not in running and book.pick("claude", None, now):
        book.start(f"r{run}", "claude", "a", now)
        running.add(run)
    elif what in ("finish", "unspawned") and run in running:
        book.finish(f"r{run}", now, spawned=what == "finish")
        running.discard(run)
    elif what == "rest":
        book.rest("claude", "a", now + 300.0, "limit")
    elif what == "wake":
        book.wake("claude", "a")


def _moments(ops: list[tuple[str, int, int]]) -> list[float]:
    """Each operation's moment: its own, or the one before if later (time never goes back)."""
    moments, now = [], T0
    for _, _, moment in ops:
        now = max(now, T0 + moment * 600.0)
        moments.append(now)
    return moments


@settings(max_examples=150, deadline=None)
@given(_OPS)
def test_answers_asked_along_the_way_equal_a_fresh_books(ops: list[tuple[str, int, int]]) -> None:
    # One book asked after every operation (so it keeps answers from one
    # question to the next) against a fresh book given the same operations
    # and asked only at the end.
    moments = _moments(ops)
    asked, running = _book(), set[int]()
    for done, (op, now) in enumerate(zip(ops, moments, strict=True), start=1):
        _apply(asked, running, op, now)
        fresh, fresh_running = _book(), set[int]()
        for earlier, at in zip(ops[:done], moments[:done], strict=True):
            _apply(fresh, fresh_running, earlier, at)
        for _ in range(2):  # asking twice at one moment changes nothing
            assert asked.pick("claude", None, now) == fresh.pick("claude", None, now)
            assert asked.next_change("claude", now) == fresh.next_change("claude", now)
            assert asked.statuses(now) == fresh.statuses(now)
