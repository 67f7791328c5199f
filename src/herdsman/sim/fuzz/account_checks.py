"""The fuzzer's checks of budgets, refused logins and retries, from its own model of accounts.

:class:`AccountChecks` is fed what the agents said (each attempt's end, as
the stand-in runner played it: its failure class, whether it worked, what
it spent, a refused login) and what the supervisor traced (starts, ends,
retries, reloads, ends of rests, restarts), and checks, with the
configuration in force:

* **budget** — no attempt starts on an account whose usage in its rolling
  window had already reached its budget. Usage is counted as
  docs/accounts.md defines it, from what the agents reported, never from
  the supervisor's books: ``runs`` counts the attempts started in the
  window (a start that never got a process is given back); ``run_minutes``
  the minutes of attempts that ended in the window plus what running ones
  ran in it; ``tokens`` and ``usd`` what attempts that ended in the window
  spent (tokens: input, cache writes and output) plus, for each attempt
  running on the account, the mean of those that stated the figure. An
  attempt moved off its account (a usage limit, a refused login) is
  charged no spend. Budgets are checked at a start, so a run that started
  within budget may end over it: that is allowed. After a restart (and
  when a reload brings an account back) usage is what the ledger restores:
  each run's current attempt only, an attempt running at the crash as a
  start (lost); the earlier attempts of a retried run are no longer
  counted. The model is never more than the supervisor counts, so a
  violation is always a start the budget should have stopped. Two events
  at one instant may be read on either side of a window's edge: a
  violation must hold whichever side.
* **needs login** — an account on which an attempt failed to authenticate
  takes no new run until a reload is applied (any: even of an unchanged
  file, but not a rejected one), an end of its rest by hand, or a restart.
* **retry attempts** — a retry's attempt number is the run's own count of
  starts, and below the provider's ``attempts``;
* **retry class** — a retried attempt failed, of the class the retry
  names, and that class is in the policy's ``on``;
* **retry after work** — an attempt in which the agent worked is retried
  only if its class is in ``after_work``.

The lane order across retries (a retried run is never overtaken by a later
run of its conversation) is the checker's FIFO check, named ``retry order``
when the run overtaken waits out a retry's backoff
(:mod:`herdsman.sim.fuzz.invariants`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from herdsman.config.durations import parse_duration

__all__ = ["AccountChecks", "AgentEnd"]

#: How close (seconds) two times must be for either to count as first: a
#: trace time and the supervisor's wall clock may differ in the last bits.
_EDGE = 1e-3
#: What a float sum of dollars may drift by before it counts as more.
_DRIFT = 1e-9


@attrs.frozen
class AgentEnd:
    """How an attempt ended, as its agent's stream and process said.

    ``failure``: the retry class of the failure it ended with
    (``authentication_failed`` for a refused login; None when it succeeded,
    was stopped or hit a usage limit); ``worked``: it called a tool first;
    ``tokens`` (those a budget counts) and ``usd``: what it spent, None when
    its stream stated none; ``limited``: it hit a usage limit.
    """

    failure: str | None
    worked: bool = False
    tokens: int | None = None
    usd: float | None = None
    limited: bool = False


@attrs.define
class _Use:
    """One attempt on an account, as a budget counts it."""

    run_id: str
    start: float
    end: float | None = None
    spawned: bool = True
    tokens: int | None = None
    usd: float | None = None


@attrs.frozen
class _Budget:
    window: float
    budget: float
    unit: str


@attrs.frozen
class _Policy:
    attempts: int
    on: frozenset[str]
    after_work: frozenset[str]


#: The policy of a provider no longer configured: it retries nothing.
_NO_RETRIES = _Policy(1, frozenset(), frozenset())


def _seconds(text: str) -> float:
    return parse_duration(text).total_seconds()


class AccountChecks:
    """Budgets, logins and retries, checked as the trace goes; ``fail(kind, message)``."""

    def __init__(self, fail: Callable[[str, str], None]) -> None:
        self._fail = fail
        self._budgets: dict[tuple[str, str], _Budget] = {}
        self._policies: dict[str, _Policy] = {}
        self._configured: set[tuple[str, str]] = set()
        self._uses: dict[tuple[str, str], list[_Use]] = {}
        # Each run's account and its current attempt's use (None: none yet).
        self._current: dict[str, tuple[tuple[str, str], _Use]] = {}
        self._starts: dict[str, int] = {}
        self._ends: dict[str, AgentEnd] = {}  # the attempt that just ended, by run
        self._retried: set[str] = set()  # runs whose finish follows a retry event
        self._login: set[tuple[str, str]] = set()
        self.backoff: set[str] = set()  # runs waiting out a retry's backoff

    # -- the configuration -------------------------------------------------

    def configure(self, config: Mapping[str, Any], *, restart: bool) -> None:
        """A configuration is in force (a start, a restart, an applied reload).

        Any reload logs every account in; an account it brings back gets its
        usage from the ledger, as after a restart.
        """
        budgets, policies, configured = {}, {}, set()
        for provider, settings in config["providers"].items():
            retry = settings["retry"]  # the defaults, when the file has no table
            policies[provider] = _Policy(
                int(retry["attempts"]), frozenset(retry["on"]), frozenset(retry["after_work"])
            )
            for account in settings.get("accounts") or ():
                key = (provider, account["name"])
                configured.add(key)
                if account.get("budget") is not None and account.get("window") is not None:
                    budgets[key] = _Budget(
                        _seconds(account["window"]),
                        float(account["budget"]),
                        account.get("budget_unit", "runs"),
                    )
        back = configured - self._configured
        self._budgets, self._policies, self._configured = budgets, policies, configured
        self._login.clear()
        for key in sorted(back):
            if not restart:
                self._restore(key)

    def crashed(self, lost: set[str]) -> None:
        """The supervisor died: the next one's usage is what the ledger holds, no login needed.

        ``lost``: the runs that were running then (the next one records them
        lost, ended when they started). Set now, before the next one starts
        anything.
        """
        for run_id in lost:
            current = self._current.get(run_id)
            if current is not None and current[1].end is None:
                use = current[1]
                use.end, use.tokens, use.usd = use.start, None, None
        for key in sorted(self._uses):
            self._restore(key)
        self._login.clear()
        self.backoff.clear()
        self._ends.clear()
        self._retried.clear()

    def _restore(self, key: tuple[str, str]) -> None:
        """``key``'s usage as the ledger gives it back: each run's current attempt."""
        self._uses[key] = [use for account, use in self._current.values() if account == key]

    # -- what happened -----------------------------------------------------

    def agent_ended(self, run_id: str, end: AgentEnd) -> None:
        """The stand-in runner ended ``run_id``'s attempt as its agent said."""
        self._ends[run_id] = end

    def started(self, run_id: str, provider: str, account: str | None, t: float) -> None:
        """An attempt of ``run_id`` started on ``account`` at ``t``: check it may."""
        self._starts[run_id] = self._starts.get(run_id, 0) + 1
        self.backoff.discard(run_id)
        self._ends.pop(run_id, None)
        if account is None:
            return
        key = (provider, account)
        if key in self._login:
            self._fail(
                "needs login",
                f"{run_id} started on {provider}/{account}, which a refused login marked"
                " as needing one (no reload or end of its rest since)",
            )
        budget = self._budgets.get(key)
        uses = self._uses.setdefault(key, [])
        if budget is not None:
            used = self._usage(uses, budget, t)
            # Runs and tokens are whole numbers, summed exactly; minutes and
            # dollars are float sums the supervisor adds up in another order.
            drift = 0.0 if budget.unit in ("runs", "tokens") else _DRIFT * budget.budget
            if used >= budget.budget + drift:
                self._fail(
                    "budget",
                    f"{run_id} started on {provider}/{account} with {used:g} {budget.unit}"
                    f" of its budget of {budget.budget:g} per {budget.window:g}s used",
                )
        use = _Use(run_id, t)
        uses.append(use)
        self._current[run_id] = (key, use)

    def retried(self, run_id: str, provider: str, fields: Mapping[str, Any]) -> None:
        """A ``retry`` event: the failed attempt of ``run_id`` is to be tried again."""
        self._retried.add(run_id)
        self.backoff.add(run_id)
        policy = self._policies.get(provider, _NO_RETRIES)
        attempt, failure = fields["attempt"], fields["failure"]
        starts = self._starts.get(run_id, 0)
        if attempt != starts or attempt >= policy.attempts:
            self._fail(
                "retry attempts",
                f"{run_id}'s attempt {attempt} (its start {starts}) retried; {provider}"
                f" allows {policy.attempts} attempt(s)",
            )
            return
        end = self._ends.get(run_id)
        if end is None or end.failure != failure or failure not in policy.on:
            said = "no failure" if end is None or end.failure is None else end.failure
            self._fail(
                "retry class",
                f"{run_id} retried as {failure}; its agent said {said}, and {provider}"
                f" retries on {sorted(policy.on)}",
            )
        elif end.worked and failure not in policy.after_work:
            self._fail(
                "retry after work",
                f"{run_id} retried after its agent worked, of {failure}, not in {provider}'s"
                f" after_work {sorted(policy.after_work)}",
            )

    def finished(self, run_id: str, fields: Mapping[str, Any], t: float) -> None:
        """A ``finish`` event: the attempt is charged to its account, or moved off it."""
        end = self._ends.pop(run_id, None)
        retried = run_id in self._retried
        self._retried.discard(run_id)
        current = self._current.get(run_id)
        if current is None:
            return
        key, use = current
        use.end = t
        use.spawned = fields.get("exit_code") is not None
        moved = fields.get("requeued") and not retried
        if end is not None and not moved:
            use.tokens, use.usd = end.tokens, end.usd
        if fields.get("requeued"):
            # Queued again: the ledger clears the attempt (a restart forgets it).
            del self._current[run_id]
        if (
            end is not None
            and end.failure == "authentication_failed"
            and fields.get("outcome") != "succeeded"
            and key in self._configured
        ):
            self._login.add(key)

    def logged_in(self) -> None:
        """A reload of a valid file is asked for: every account is logged in again."""
        self._login.clear()

    def rest_ended(self, provider: str, account: str | None) -> None:
        """An account's rest was ended by hand: it is logged in again."""
        if account is not None:
            self._login.discard((provider, account))

    def withdrawn(self, run_id: str) -> None:
        """A queued run was cancelled (a backoff's wait ends with it)."""
        self.backoff.discard(run_id)

    # -- the arithmetic ----------------------------------------------------

    def _usage(self, uses: list[_Use], budget: _Budget, now: float) -> float:
        """The least usage the account can have had at ``now``, over a window edge's doubt."""
        return min(self._usage_at(uses, budget, now, edge) for edge in (-_EDGE, _EDGE))

    @staticmethod
    def _usage_at(uses: list[_Use], budget: _Budget, now: float, edge: float) -> float:
        """Usage at ``now`` with the window's horizon moved by ``edge`` (the doubt at its edge)."""
        horizon = now - budget.window + edge
        running = [u for u in uses if u.end is None]
        ended = [u for u in uses if u.end is not None and u.spawned and u.end > horizon]
        if budget.unit == "runs":
            return float(sum(1 for u in uses if u.start > horizon and (u.end is None or u.spawned)))
        if budget.unit == "run_minutes":
            seconds = sum(max(0.0, u.end - u.start) for u in ended if u.end is not None)
            seconds += sum(max(0.0, now - max(u.start, horizon)) for u in running)
            return seconds / 60.0
        figures = [u.tokens if budget.unit == "tokens" else u.usd for u in ended]
        stated = [float(f) for f in figures if f is not None]
        total = sum(stated)
        if running and stated:
            return total + len(running) * (total / len(stated))
        return total
