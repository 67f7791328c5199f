"""The account core's budgets in tokens and dollars, warnings and needed logins, on a fake clock."""

from __future__ import annotations

import pytest

from herdsman.core.accounts import AccountBook, AccountSpec, AccountUse, Charge, amount_text

HOUR = 3600.0
T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock


def book_of(*specs: AccountSpec) -> AccountBook:
    return AccountBook({"claude": list(specs)})


def run(book: AccountBook, run_id: str, start: float, end: float, charge: Charge) -> None:
    pick = book.pick("claude", None, start)
    assert pick is not None
    book.start(run_id, "claude", pick.account, start)
    book.finish(run_id, end, charge=charge)


def usage(book: AccountBook, name: str, now: float) -> float:
    [status] = [s for s in book.statuses(now) if s.account == name]
    return status.usage


def test_a_tokens_budget_counts_ended_runs_and_running_ones_at_their_mean() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=1000, unit="tokens"))
    book.start("r0", "claude", "a", T0)
    assert usage(book, "a", T0) == 0  # nothing has ended: no mean to count it at
    book.finish("r0", T0 + 10, charge=Charge(tokens=300))
    book.start("r1", "claude", "a", T0 + 20)
    book.finish("r1", T0 + 30, charge=Charge())  # said nothing: not in the mean
    book.start("r2", "claude", "a", T0 + 40)
    book.start("r3", "claude", "a", T0 + 40)
    assert usage(book, "a", T0 + 50) == 300 + 2 * 300
    assert book.pick("claude", None, T0 + 50) is not None
    book.start("r4", "claude", "a", T0 + 50)
    # 300 + three running at 300: the budget is spent before any of them ends.
    assert book.pick("claude", None, T0 + 60) is None
    blocked = book.blocked("claude", T0 + 60)
    assert blocked is not None
    assert blocked.reason == "a: budget of 1,000 tokens per window spent"
    # The only figure leaves the window when its run's end does.
    assert blocked.until == T0 + 10 + HOUR
    assert usage(book, "a", T0 + 10 + HOUR) == 0


def test_a_dollar_budget_counts_other_members_and_an_earlier_process_alike() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=2.5, unit="usd"))
    book.restore_usage("claude", "a", T0 - 100, T0 - 50, Charge(usd=1.0))
    book.set_elsewhere(
        [
            AccountUse("claude", "a", T0 - 40, T0 - 20, None, 0.5),
            AccountUse("claude", "a", T0 - 10, None),  # running elsewhere
        ]
    )
    # 1.50 ended, and one running at their mean of 0.75.
    assert usage(book, "a", T0) == 2.25
    book.start("r0", "claude", "a", T0)
    assert book.pick("claude", None, T0 + 1) is None  # 1.50 + two running at 0.75
    assert amount_text(2.5, "usd") == "$2.50"


def test_a_figure_known_only_once_recorded_counts_as_though_stated_at_the_end() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=1000, unit="tokens"))
    run(book, "r0", T0, T0 + 10, Charge())
    book.charge("claude", "a", T0 + 10, Charge(tokens=1000))
    assert usage(book, "a", T0 + 20) == 1000
    assert book.pick("claude", None, T0 + 20) is None


def test_a_warned_account_takes_new_conversations_last_until_its_reset() -> None:
    book = book_of(AccountSpec("a"), AccountSpec("b"))
    book.start("r0", "claude", "a", T0)
    book.remember("claude", "w/c1", "a")
    book.finish("r0", T0 + 1)
    book.warn("claude", "a", T0 + 100)
    assert book.pick("claude", "w/c2", T0 + 2).account == "b"  # type: ignore[union-attr]
    assert book.pick("claude", None, T0 + 2).account == "b"  # type: ignore[union-attr]
    # Its session lives on a: the conversation keeps it.
    assert book.pick("claude", "w/c1", T0 + 2).account == "a"  # type: ignore[union-attr]
    [a, _] = book.statuses(T0 + 2)
    assert (a.near_limit_until, a.available) == (T0 + 100, True)
    # Near its limit, not over it: with b at its cap, a takes the run.
    capped = book_of(AccountSpec("a"), AccountSpec("b", concurrency=1))
    capped.warn("claude", "a", T0 + 100)
    capped.start("r1", "claude", "b", T0)
    assert capped.pick("claude", None, T0 + 2).account == "a"  # type: ignore[union-attr]
    # After its reset, a is first again.
    assert book.pick("claude", None, T0 + 100).account == "a"  # type: ignore[union-attr]
    assert book.statuses(T0 + 100)[0].near_limit_until is None


@pytest.mark.parametrize("cleared_by", ["reload", "end-rest"])
def test_an_account_that_needs_a_login_takes_no_run_until_cleared(cleared_by: str) -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=5))
    book.need_login("claude", "a", "Not logged in")
    assert book.pick("claude", None, T0) is None
    blocked = book.blocked("claude", T0)
    assert blocked is not None
    assert (blocked.reason, blocked.until) == ("a: needs login (Not logged in)", None)
    # Time alone never frees it.
    assert book.next_change("claude", T0 + 10 * HOUR) is None
    assert book.statuses(T0)[0].needs_login == "Not logged in"
    if cleared_by == "reload":
        assert book.logged_in() == [("claude", "a")]
        assert book.logged_in() == []
    else:
        assert book.wake("claude", "a")
    assert book.pick("claude", None, T0) is not None
    assert book.statuses(T0)[0].needs_login is None
