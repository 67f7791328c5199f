"""Bugs planted in the supervisor's accounts and retries, for the fuzzer to find.

Each plant is a function that applies one bug with a ``MonkeyPatch``; the
tests (test_fuzz_planted_accounts.py) check that ``herdsman sim fuzz``
finds it and names the invariant it breaks.
"""

from __future__ import annotations

from typing import Any

import pytest

from herdsman.core import account_usage
from herdsman.core.accounts import AccountBook
from herdsman.core.retry import RetryPolicy
from herdsman.core.scheduler import Scheduler


def estimate_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokens or usd budget counts running runs as nothing (no estimate)."""
    monkeypatch.setattr(account_usage, "spent_with_estimate", lambda total, stated, running: total)


def forget_logins(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused login never marks its account."""
    monkeypatch.setattr(AccountBook, "need_login", lambda self, provider, account, message: None)


def retry_past_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy retries however many attempts a run has had."""

    def retries(self: RetryPolicy, failure: Any, attempt: int, *, worked: bool) -> bool:
        return failure in self.on and (not worked or failure in self.after_work)

    monkeypatch.setattr(RetryPolicy, "retries", retries)


def retry_any_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy retries every class, listed in ``on`` or not."""

    def retries(self: RetryPolicy, failure: Any, attempt: int, *, worked: bool) -> bool:
        return attempt < self.attempts and (not worked or failure in self.after_work)

    monkeypatch.setattr(RetryPolicy, "retries", retries)


def retry_after_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy retries an attempt in which the agent worked, whatever ``after_work`` says."""

    def retries(self: RetryPolicy, failure: Any, attempt: int, *, worked: bool) -> bool:
        return attempt < self.attempts and failure in self.on

    monkeypatch.setattr(RetryPolicy, "retries", retries)


def release_lanes_in_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run waiting out a retry's backoff gives its lanes up (and takes them back after)."""
    hold, requeue = Scheduler.hold, Scheduler.requeue

    def leaky_hold(self: Scheduler, run_id: str) -> None:
        hold(self, run_id)
        for lane, exclusive in self._entries[run_id].locks:
            if exclusive:
                lane.x_holders -= 1
            else:
                lane.ix_holders -= 1
            self._lane_changed(lane)

    def taking_back(self: Scheduler, run_id: str) -> None:
        if run_id in self._held:
            for lane, exclusive in self._entries[run_id].locks:
                if exclusive:
                    lane.x_holders += 1
                else:
                    lane.ix_holders += 1
        requeue(self, run_id)

    monkeypatch.setattr(Scheduler, "hold", leaky_hold)
    monkeypatch.setattr(Scheduler, "requeue", taking_back)
