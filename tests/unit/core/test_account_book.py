"""The account core on a fake clock: windows, stickiness, rotation, exhaustion, caps."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from herdsman.core import Limits, RunRequest, Scheduler
from herdsman.core.accounts import (
    DEFAULT_REST,
    AccountBook,
    AccountGate,
    AccountSpec,
    Pick,
    conversation_of,
)

HOUR = 3600.0
T0 = 1_800_000_000.0  # a unix time; nothing here reads a real clock


def book_of(*specs: AccountSpec, provider: str = "claude") -> AccountBook:
    return AccountBook({provider: list(specs)})


def start(book: AccountBook, run_id: str, conversation: str | None, now: float) -> Pick:
    """Pick and start, and have the run report a session (so its account sticks)."""
    pick = book.pick("claude", conversation, now)
    assert pick is not None, f"no account for {run_id} at {now}"
    book.start(run_id, "claude", pick.account, now)
    if conversation is not None:
        book.remember("claude", conversation, pick.account)
    return pick


def test_a_provider_without_accounts_runs_in_the_ambient_environment() -> None:
    book = AccountBook({"plain": []})
    assert book.pick("plain", "c", T0) == Pick(None)
    book.start("r1", "plain", None, T0)
    assert book.holding("r1") is None
    assert book.available("plain", T0)  # no cap on the ambient account


def test_an_exhausted_ambient_environment_pauses_its_provider_until_the_reset() -> None:
    book = AccountBook({"plain": []})
    until = book.exhaust("plain", None, T0, T0 + 600, "limit reached")
    assert until == T0 + 600
    assert not book.available("plain", T0 + 599)
    blocked = book.blocked("plain", T0 + 1)
    assert blocked is not None
    assert blocked.until == T0 + 600
    assert "the ambient account: usage limit reached" in blocked.reason
    assert book.available("plain", T0 + 600)
    assert book.blocked("plain", T0 + 600) is None


def test_time_may_free_an_account_only_after_a_rest_or_with_a_budget_window() -> None:
    book = AccountBook({"plain": [], "capped": [AccountSpec("a", concurrency=1)]})
    book.start("r1", "capped", "a", T0)
    assert not book.may_free_in_time  # a cap is freed by a run's end, never by time
    book.rest("plain", None, T0 + 600, "limit reached")
    assert book.may_free_in_time
    assert book.next_change("plain", T0) == T0 + 600
    windowed = AccountBook({"plain": []})
    windowed.configure("plain", [AccountSpec("a", window=HOUR, budget=1)])
    assert windowed.may_free_in_time
    assert not AccountBook({"plain": [AccountSpec("a", window=HOUR)]}).may_free_in_time


def test_a_runs_budget_rolls_over_with_its_window() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=2))
    start(book, "r1", None, T0)
    start(book, "r2", None, T0 + 60)
    book.finish("r1", T0 + 120)
    book.finish("r2", T0 + 180)
    assert book.pick("claude", None, T0 + 200) is None
    # The first start leaves the window one hour after it happened.
    assert book.next_change("claude", T0 + 200) == T0 + HOUR
    assert book.pick("claude", None, T0 + HOUR - 1) is None
    assert book.pick("claude", None, T0 + HOUR) == Pick("a")
    [status] = book.statuses(T0 + HOUR)
    assert status.usage == 1.0
    assert status.runs_started == 2


def test_a_run_minutes_budget_counts_finished_and_running_minutes() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=10, unit="run_minutes"))
    start(book, "r1", None, T0)
    book.finish("r1", T0 + 6 * 60)  # six minutes spent
    start(book, "r2", None, T0 + 7 * 60)
    assert book.statuses(T0 + 10 * 60)[0].usage == pytest.approx(9.0)
    assert book.available("claude", T0 + 10 * 60)
    # Four minutes into r2, 6 + 4 = 10 run-minutes: spent.
    assert not book.available("claude", T0 + 11 * 60)
    book.finish("r2", T0 + 11 * 60)
    # r1's six minutes leave the window an hour after r1 ended.
    assert book.next_change("claude", T0 + 12 * 60) == T0 + 6 * 60 + HOUR
    assert book.available("claude", T0 + 6 * 60 + HOUR)


def test_a_conversation_keeps_its_account_while_it_is_available() -> None:
    book = book_of(AccountSpec("a"), AccountSpec("b"))
    assert start(book, "r1", "ws/c", T0) == Pick("a")
    book.finish("r1", T0 + 1)
    start(book, "x1", None, T0 + 2)  # "a" is now busier than "b"
    assert book.pick("claude", "ws/c", T0 + 3) == Pick("a")
    assert book.pick("claude", "ws/other", T0 + 3) == Pick("b")


def test_a_conversation_moves_when_its_account_is_exhausted_and_is_told_so() -> None:
    book = book_of(AccountSpec("a"), AccountSpec("b"))
    start(book, "r1", "ws/c", T0)
    book.finish("r1", T0 + 1)
    book.exhaust("claude", "a", T0 + 2, T0 + HOUR, "You've hit your limit")
    pick = start(book, "r2", "ws/c", T0 + 3)
    assert pick == Pick("b", moved=True, moved_from="a")
    book.finish("r2", T0 + 4)
    # Once moved, "b" is the conversation's account, even after "a" is back.
    assert book.pick("claude", "ws/c", T0 + 2 * HOUR) == Pick("b")


def test_rotation_prefers_the_least_loaded_then_least_used_then_config_order() -> None:
    book = book_of(
        AccountSpec("a", window=HOUR, budget=10),
        AccountSpec("b", window=HOUR, budget=10),
        AccountSpec("c", window=HOUR, budget=10),
    )
    assert start(book, "r1", None, T0) == Pick("a")  # all equal: config order
    assert start(book, "r2", None, T0) == Pick("b")  # a is running one
    assert start(book, "r3", None, T0) == Pick("c")
    book.finish("r2", T0 + 1)
    book.finish("r3", T0 + 1)
    # b and c run nothing and used 1/10 each; a runs one: b by config order.
    assert book.pick("claude", None, T0 + 2) == Pick("b")
    start(book, "r4", None, T0 + 2)
    book.finish("r4", T0 + 3)
    # Now b used 2/10, c 1/10: c has the smaller share used.
    assert book.pick("claude", None, T0 + 4) == Pick("c")


def test_per_account_concurrency_caps_bind_and_free_up() -> None:
    book = book_of(AccountSpec("a", concurrency=1), AccountSpec("b", concurrency=1))
    assert start(book, "r1", None, T0) == Pick("a")
    assert start(book, "r2", None, T0) == Pick("b")
    assert book.pick("claude", None, T0) is None
    blocked = book.blocked("claude", T0)
    assert blocked is not None
    assert blocked.until is None  # only a run ending frees an account
    assert "a: at its concurrency cap (1)" in blocked.reason
    book.finish("r2", T0 + 5)
    assert book.pick("claude", None, T0 + 5) == Pick("b")


def test_runs_in_flight_keep_their_account_while_the_preferred_one_changes() -> None:
    book = book_of(AccountSpec("a"), AccountSpec("b"))
    start(book, "r1", "ws/c1", T0)  # a
    start(book, "r2", "ws/c2", T0)  # b (a is busier)
    book.exhaust("claude", "a", T0 + 1, T0 + HOUR, "limit")
    assert start(book, "r3", "ws/c1", T0 + 2) == Pick("b", moved=True, moved_from="a")
    assert [book.holding(r) for r in ("r1", "r2", "r3")] == ["a", "b", "b"]
    statuses = {s.account: s for s in book.statuses(T0 + 3)}
    assert statuses["a"].running == 1
    assert statuses["a"].exhausted_until == T0 + HOUR
    assert not statuses["a"].available
    assert statuses["b"].running == 2
    book.finish("r1", T0 + 4)
    assert {s.account: s.running for s in book.statuses(T0 + 4)} == {"a": 0, "b": 2}


def test_a_limit_without_a_usable_reset_rests_for_the_window_or_the_default() -> None:
    book = AccountBook({"p": [AccountSpec("w", window=5 * HOUR), AccountSpec("n")]})
    assert book.exhaust("p", "w", T0, None, "limit") == T0 + 5 * HOUR
    assert book.exhaust("p", "n", T0, T0 - 10, "limit, reset in the past") == T0 + DEFAULT_REST
    assert book.exhaust("p", "gone", T0, None, "limit") is None


def test_a_removed_account_stays_held_by_its_runs_and_is_never_picked() -> None:
    book = book_of(AccountSpec("a"), AccountSpec("b"))
    start(book, "r1", None, T0)  # a
    book.configure("claude", [AccountSpec("b")])
    assert book.pick("claude", None, T0 + 1) == Pick("b")
    assert book.holding("r1") == "a"
    [_, a] = book.statuses(T0 + 1)
    assert (a.account, a.retired, a.running, a.available) == ("a", True, 1, False)
    book.finish("r1", T0 + 2)
    assert [s.account for s in book.statuses(T0 + 2)] == ["b"]


def test_an_account_kept_by_a_reload_keeps_its_usage_and_takes_new_limits() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=3))
    for n in range(2):
        start(book, f"r{n}", None, T0)
        book.finish(f"r{n}", T0 + 1)
    book.configure("claude", [AccountSpec("a", window=HOUR, budget=2)])
    assert book.pick("claude", None, T0 + 2) is None
    book.configure("claude", [AccountSpec("a", window=HOUR, budget=5)])
    assert book.pick("claude", None, T0 + 2) == Pick("a")


def test_an_account_a_reload_takes_the_window_from_counts_no_runs() -> None:
    # Starts count only in a window: those from before the reload are not usage.
    book = book_of(AccountSpec("a", window=HOUR, budget=3))
    start(book, "r0", None, T0)
    book.finish("r0", T0 + 1)
    book.configure("claude", [AccountSpec("a")])
    [status] = book.statuses(T0 + 2)
    assert (status.usage, status.runs_started) == (0.0, 1)


def test_restored_usage_and_limits_count_after_a_restart() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=2), AccountSpec("b"))
    book.restore_usage("claude", "a", T0 - 100, T0 - 50)
    book.restore_usage("claude", "a", T0 - 10, T0 - 5)
    book.rest("claude", "b", T0 + 60, "limit")
    book.remember("claude", "ws/c", "b")
    assert book.pick("claude", "ws/c", T0) is None
    assert book.pick("claude", "ws/c", T0 + 60) == Pick("b")


def test_repeated_account_names_are_refused() -> None:
    with pytest.raises(ValueError, match="repeat"):
        book_of(AccountSpec("a"), AccountSpec("a"))


def test_the_gate_starts_only_what_the_accounts_can_take_and_records_each_pick() -> None:
    book = book_of(AccountSpec("a", concurrency=1), AccountSpec("b", concurrency=2))
    sched = Scheduler(Limits({"claude": 8}))
    runs = [RunRequest(f"r{n}", "claude", conversation=f"c{n}") for n in range(5)]
    for run in runs:
        sched.submit(run)
    gate = book.gate(T0)
    assert sched.take_startable(gate) == runs[:3]
    assert {run_id: pick.account for run_id, pick in gate.picks.items()} == {
        "r0": "a",
        "r1": "b",
        "r2": "b",
    }
    sched.finish("r0")
    book.finish("r0", T0 + 1)
    gate = book.gate(T0 + 1)
    assert sched.take_startable(gate) == [runs[3]]
    assert gate.picks["r3"] == Pick("a")


def test_a_pinned_run_starts_on_its_account_when_that_one_can_take_it() -> None:
    book = book_of(
        AccountSpec("a", concurrency=1), AccountSpec("b", concurrency=1), AccountSpec("c")
    )
    sched = Scheduler(Limits({"claude": 8}))
    runs = [RunRequest(f"r{n}", "claude", conversation=f"c{n}") for n in range(3)]
    for run in runs:
        sched.submit(run)
    book.pin("r0", "b")  # free: honoured, though a comes first in config order
    book.pin("r1", "b")  # b is taken by r0 by then: picked as usual
    book.pin("r2", "gone")  # not configured: picked as usual
    gate = book.gate(T0)
    assert sched.take_startable(gate) == runs
    assert {run_id: pick.account for run_id, pick in gate.picks.items()} == {
        "r0": "b",
        "r1": "a",
        "r2": "c",
    }
    # A pin is used once: the run's next start (a re-queue) picks as usual.
    sched.finish("r0")
    book.finish("r0", T0 + 1)
    book.finish("r1", T0 + 1)
    sched.finish("r1")
    rerun = RunRequest("r0", "claude", conversation="c0")
    sched.submit(rerun)
    gate = book.gate(T0 + 2)
    assert sched.take_startable(gate) == [rerun]
    assert gate.picks["r0"] == Pick("a")


def test_conversation_of_scopes_by_workspace() -> None:
    assert conversation_of(RunRequest("r", "p", conversation="c", workspace="w")) == "w/c"
    assert conversation_of(RunRequest("r", "p")) is None


# -- properties ---------------------------------------------------------------

ACCOUNTS = ("a", "b", "c")
CONVERSATIONS = (None, "c0", "c1", "c2")
spec_st = st.builds(
    AccountSpec,
    name=st.just("placeholder"),
    window=st.sampled_from((None, 600.0, HOUR)),
    budget=st.sampled_from((None, 1, 2, 5)),
    unit=st.sampled_from(("runs", "run_minutes")),
    concurrency=st.sampled_from((None, 1, 2)),
)


class AccountMachine(RuleBasedStateMachine):
    """Random starts, ends, limits, reloads and time: the rules must always hold."""

    def __init__(self) -> None:
        super().__init__()
        self.now = T0
        self.book = AccountBook()
        self.specs: dict[str, AccountSpec] = {}
        self.running: dict[str, tuple[str | None, str | None]] = {}  # run -> (account, conv)
        self.last: dict[str, str | None] = {}  # conversation -> account it used last
        self.next_id = 0

    def configure(self, specs: list[AccountSpec]) -> None:
        named = []
        for name, spec in zip(ACCOUNTS, specs, strict=False):
            budget = spec.budget if spec.window is not None else None
            named.append(AccountSpec(name, spec.window, budget, spec.unit, spec.concurrency))
        self.specs = {s.name: s for s in named if s.name is not None}
        self.book.configure("p", named)

    @initialize(specs=st.lists(spec_st, min_size=0, max_size=3))
    def setup(self, specs: list[AccountSpec]) -> None:
        self.configure(specs)

    @rule(conversation=st.sampled_from(CONVERSATIONS))
    def start(self, conversation: str | None) -> None:
        book, now = self.book, self.now
        before = {s.account: s for s in book.statuses(now) if not s.retired}
        pick = book.pick("p", conversation, now)
        assert (pick is not None) == book.available("p", now)
        # The gate's answer (which skips why_not for an account only a rest can stop) agrees.
        assert (pick is not None) == AccountGate(book, now).can_start("p")
        if pick is None:
            assert all(not s.available for s in before.values())
            return
        chosen = before[pick.account]
        assert chosen.available, f"picked {pick.account}, which is not available: {chosen}"
        spec = self.specs.get(pick.account) if pick.account is not None else None
        if spec is not None and spec.concurrency is not None:
            assert chosen.running < spec.concurrency
        if spec is not None and spec.budget is not None:
            assert chosen.usage < spec.budget
        if chosen.exhausted_until is not None:
            assert chosen.exhausted_until <= now
        run_id = f"r{self.next_id}"
        self.next_id += 1
        book.start(run_id, "p", pick.account, now)
        self.running[run_id] = (pick.account, conversation)
        if conversation is not None:  # the run reports a session on its account
            book.remember("p", conversation, pick.account)
            self.last[conversation] = pick.account

    @rule(conversation=st.sampled_from(CONVERSATIONS[1:]))
    def stickiness(self, conversation: str) -> None:
        """While the account a conversation used last is available, it is picked again."""
        pick = self.book.pick("p", conversation, self.now)
        if conversation not in self.last or pick is None:
            return
        statuses = {s.account: s for s in self.book.statuses(self.now) if not s.retired}
        previous = self.last[conversation]
        if previous in statuses and statuses[previous].available:
            assert pick == Pick(previous)
        else:
            assert pick.moved
            assert pick.moved_from == previous

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.running)))
        account, _ = self.running.pop(run_id)
        assert self.book.holding(run_id) == account
        self.book.finish(run_id, self.now)

    @rule(
        account=st.sampled_from((None, *ACCOUNTS)),
        resets_in=st.sampled_from((None, -5.0, 30.0, 900.0)),
    )
    def exhaust(self, account: str | None, resets_in: float | None) -> None:
        resets_at = None if resets_in is None else self.now + resets_in
        until = self.book.exhaust("p", account, self.now, resets_at, "limit")
        if until is not None:
            assert until > self.now
            assert not self.book.available("p", self.now) or any(
                s.available and s.account != account for s in self.book.statuses(self.now)
            )

    @rule(seconds=st.sampled_from((1.0, 59.0, 600.0, 3600.0)))
    def tick(self, seconds: float) -> None:
        self.now += seconds

    @rule()
    def wait_for_the_next_change(self) -> None:
        """At the time next_change names, something changed: an account is free,
        or the next change lies further ahead (a later cause still blocks)."""
        change = self.book.next_change("p", self.now)
        if change is None or self.book.available("p", self.now):
            return
        self.now = change
        later = self.book.next_change("p", self.now)
        assert self.book.available("p", self.now) or later is None or later > change

    @rule(specs=st.lists(spec_st, min_size=0, max_size=3))
    def reload(self, specs: list[AccountSpec]) -> None:
        self.configure(specs)
        for run_id, (account, _) in self.running.items():
            assert self.book.holding(run_id) == account

    @invariant()
    def caps_hold(self) -> None:
        for status in self.book.statuses(self.now):
            spec = self.specs.get(status.account) if status.account is not None else None
            held = sum(1 for acc, _ in self.running.values() if acc == status.account)
            assert status.running == held
            # A reload may lower a cap below what runs: never raised by a start.
            if spec is not None and spec.concurrency is not None and not status.retired:
                assert status.running <= max(spec.concurrency, held)

    @invariant()
    def next_change_is_in_the_future(self) -> None:
        change = self.book.next_change("p", self.now)
        assert change is None or change > self.now

    @invariant()
    def no_change_in_time_unless_the_book_says_it_may_come(self) -> None:
        # Callers skip next_change while may_free_in_time is false.
        if not self.book.may_free_in_time:
            assert self.book.next_change("p", self.now) is None


AccountMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, report_multiple_bugs=False
)
TestAccountMachine = AccountMachine.TestCase


def test_stickiness_follows_the_session_not_a_start_that_reported_none() -> None:
    book = book_of(AccountSpec("a", concurrency=1), AccountSpec("b"))
    start(book, "r1", "ws/c", T0)  # a, with a session there
    book.finish("r1", T0 + 1)
    start(book, "x", None, T0 + 1)  # someone else fills a
    pick = book.pick("claude", "ws/c", T0 + 2)
    assert pick == Pick("b", moved=True, moved_from="a")
    book.start("r2", "claude", "b", T0 + 2)  # it fails before reporting a session
    book.finish("r2", T0 + 3, spawned=False)
    book.finish("x", T0 + 3)
    assert book.pick("claude", "ws/c", T0 + 4) == Pick("a")  # back where the session is


def test_a_run_that_never_spawned_spends_no_budget() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=1))
    book.start("r1", "claude", "a", T0)
    assert not book.available("claude", T0)
    book.finish("r1", T0 + 1, spawned=False)
    assert book.available("claude", T0 + 1)
    assert book.statuses(T0 + 1)[0].runs_started == 0


@pytest.mark.parametrize(
    "resets_at",
    [float("inf"), float("nan"), T0 + 1.7e12, T0 - 5, None],
    ids=["inf", "nan", "milliseconds", "past", "none"],
)
def test_an_unbelievable_reset_time_rests_for_the_window(resets_at: float | None) -> None:
    book = book_of(AccountSpec("a", window=5 * HOUR))
    assert book.exhaust("claude", "a", T0, resets_at, "limit") == T0 + 5 * HOUR


def test_restored_runs_leave_the_window_in_the_order_they_ended() -> None:
    book = book_of(AccountSpec("a", window=HOUR, budget=300, unit="run_minutes"))
    # Restored in start order: a long run that began first and ended last,
    # then a short one that began and ended in between.
    book.restore_usage("claude", "a", T0, T0 + 3 * HOUR)
    book.restore_usage("claude", "a", T0 + 60, T0 + 120)
    now = T0 + 3.5 * HOUR  # the short run's end has left the window; the long's has not
    assert book.statuses(now)[0].usage == pytest.approx(180.0)
