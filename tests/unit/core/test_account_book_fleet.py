"""The account core in a fleet: other members' usage as a snapshot, and the ledger's rests."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from herdsman.core.accounts import AccountBook, AccountSpec, AccountUse, BudgetUnit

HOUR = 3600.0
T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock


def book_of(*specs: AccountSpec) -> AccountBook:
    return AccountBook({"claude": list(specs)})


def used(book: AccountBook, account: str | None, now: float) -> float:
    [status] = [s for s in book.statuses(now) if s.account == account]
    return status.usage


def test_runs_other_members_started_count_toward_a_runs_budget() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=3))
    book.start("mine", "claude", "a", T0)
    book.set_elsewhere(
        [AccountUse("claude", "a", T0 - 10, T0 - 5), AccountUse("claude", "a", T0 - 1, None)]
    )
    assert used(book, "a", T0) == 3
    assert not book.available("claude", T0)
    blocked = book.blocked("claude", T0)
    assert blocked is not None
    assert blocked.reason == "a: budget of 3 runs per window spent"
    # The oldest start, elsewhere, is the first to leave the window.
    assert blocked.until == T0 - 10 + HOUR
    assert book.available("claude", T0 - 10 + HOUR)


def test_each_snapshot_replaces_the_last_one_whole() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=5))
    runs = [AccountUse("claude", "a", T0 - 10, None)]
    book.set_elsewhere(runs)
    book.set_elsewhere(runs)  # the next poll sees the same run: still one
    assert used(book, "a", T0) == 1
    book.set_elsewhere([])  # e.g. pruned, or the account left the window
    assert used(book, "a", T0) == 0


def test_run_minutes_elsewhere_count_what_ended_and_what_runs_so_far() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=30, unit="run_minutes"))
    book.set_elsewhere(
        [
            AccountUse("claude", "a", T0 - 1200, T0 - 600),  # 10 minutes, ended
            AccountUse("claude", "a", T0 - 300, None),  # 5 minutes so far
            AccountUse("claude", "a", T0 - 30, T0 - 30),  # lost: a start, no minutes
        ]
    )
    assert used(book, "a", T0) == 15
    assert used(book, "a", T0 + 900) == 30  # the running one goes on counting
    assert not book.available("claude", T0 + 900)
    # The ended run leaves the window an hour after its end.
    assert book.next_change("claude", T0 + 900) == T0 - 600 + HOUR


def test_without_a_window_nothing_elsewhere_is_counted() -> None:
    book = book_of(AccountSpec("a"))
    book.set_elsewhere([AccountUse("claude", "a", T0, None)])
    assert used(book, "a", T0) == 0


def test_the_status_shows_runs_running_elsewhere() -> None:
    book = book_of(AccountSpec("a", window=HOUR), AccountSpec("b", window=HOUR))
    book.start("mine", "claude", "a", T0)
    book.set_elsewhere(
        [AccountUse("claude", "a", T0 - 5, None), AccountUse("claude", "b", T0 - 9, T0 - 2)]
    )
    rows = {s.account: (s.running, s.running_elsewhere, s.usage) for s in book.statuses(T0)}
    assert rows == {"a": (1, 1, 2.0), "b": (0, 0, 1.0)}


def test_rests_follow_the_ledger_both_ways() -> None:
    book = book_of(AccountSpec("a"), AccountSpec("b"))
    assert not book.may_free_in_time
    changes = book.sync_rests([("claude", "a", T0 + 600, "limit reached")], T0)
    assert changes == [("claude", "a", T0 + 600)]
    assert book.may_free_in_time  # a rest from the ledger ends in time, as one reported here
    assert book.pick("claude", None, T0) is not None
    assert [s.reason for s in book.statuses(T0)] == ["usage limit reached", None]
    # The same rest again changes nothing and says nothing.
    assert book.sync_rests([("claude", "a", T0 + 600, "limit reached")], T0 + 1) == []
    # Ended through another member: gone from the ledger, over here too.
    assert book.sync_rests([], T0 + 2) == [("claude", "a", None)]
    assert [s.available for s in book.statuses(T0 + 2)] == [True, True]


def test_a_rest_that_ran_out_by_itself_is_not_reported_as_ended() -> None:
    book = book_of(AccountSpec("a"))
    book.rest("claude", "a", T0 + 10, "limit")
    assert book.sync_rests([], T0 + 10) == []
    assert book.available("claude", T0 + 10)


def test_a_rest_of_an_unknown_account_is_ignored() -> None:
    book = book_of(AccountSpec("a"))
    assert book.sync_rests([("claude", "gone", T0 + 10, "x"), ("codex", None, T0, "y")], T0) == []


uses = st.lists(
    st.tuples(
        st.integers(0, 7200),  # start, seconds after T0
        st.one_of(st.none(), st.integers(0, 3600)),  # how long it ran (None: running)
        st.booleans(),  # started by this member
        st.sampled_from(["a", "b"]),
    ),
    max_size=25,
)


@given(uses=uses, unit=st.sampled_from(["runs", "run_minutes"]), later=st.integers(0, 7200))
def test_mine_plus_elsewhere_counts_as_one_book_that_saw_every_run(
    uses: list[tuple[int, int | None, bool, str]], unit: BudgetUnit, later: int
) -> None:
    """No run counted twice or missed: the split view equals the whole one, at any time.

    ``whole`` sees every run as if it had started them all; ``split`` sees
    its own runs so, and the others' as a snapshot.
    """
    specs = [AccountSpec(name, window=HOUR, budget=4, unit=unit) for name in ("a", "b")]
    split, whole = book_of(*specs), book_of(*specs)
    elsewhere = []
    for n, (start, ran, mine, account) in enumerate(sorted(uses, key=lambda use: use[0])):
        end = None if ran is None else T0 + start + ran
        books = [whole, split] if mine else [whole]
        for book in books:
            if end is None:
                book.start(f"r{n}", "claude", account, T0 + start)
            else:
                book.restore_usage("claude", account, T0 + start, end)
        if not mine:
            elsewhere.append(AccountUse("claude", account, T0 + start, end))
    split.set_elsewhere(elsewhere)
    now = T0 + max((start for start, *_ in uses), default=0) + later
    assert [s.usage for s in split.statuses(now)] == [s.usage for s in whole.statuses(now)]
    assert split.available("claude", now) == whole.available("claude", now)
    assert split.next_change("claude", now) == whole.next_change("claude", now)
