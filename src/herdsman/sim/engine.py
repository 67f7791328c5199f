"""The fast simulation engine: the run lifecycle on a plain heap loop and a virtual clock.

Why this module is long: :class:`FastEngine` is one hot loop (every event of
every planning run goes through it), and its handlers read best beside the
loop that calls them; splitting them would add a call per event to the figure
``herdsman sim plan`` users wait on.

The trio replay (``herdsman.sim.replay``) runs the whole supervisor; this
engine drives only what decides — :class:`~herdsman.core.lifecycle.Lifecycle`,
the one home of every rule of a run's life (starts with their accounts,
finishes with their usage limits, rests and re-queues, cancels, skips,
reloads) — and does nothing but turn the workload into the lifecycle's
events, in the trio driver's order, and act on its effects:

* one event at a time: the supervisor's own timers due at a moment (an
  account's rest ending, the shutdown grace) go first, then run ends (by the
  run's arrival order), then arrivals (in trace order);
* after every event, the dispatcher's step: the lifecycle's starts at that
  moment, each traced and its end scheduled at ``Attempt.end`` (the recorded
  finish, or after the recorded duration in a what-if), then the next moment
  time alone frees an account (``Lifecycle.next_wakeup``);
* a run's end handed to the lifecycle as the outcome the trio replay's fake
  runner reports, and traced as it settles it;
* shutdowns (drain, grace, forced cancel) as the supervisor takes them, and
  the ledger reads a reload that brings an account back makes.

What it does not model is listed in docs/simulator.md (worktrees and their
notes, conversation sessions, pruning of the ledger). Nothing here touches
trio, the disk or a clock: an event costs a few core calls and a heap
operation, so a simulated day of thousands of runs takes a fraction of a
second. ``tests/sim/test_engine_equivalence.py`` proves both engines take the
same decisions.
"""

from __future__ import annotations

import datetime as dt
import heapq
import io
import math
import time
from collections.abc import Mapping
from itertools import chain
from pathlib import Path
from typing import Any

from herdsman.config import Config, LoadedConfig
from herdsman.config.report import config_as_json
from herdsman.core import RunRequest, RunState, busy_keys
from herdsman.core.lifecycle import Admission, Lifecycle, LoginNeeded, Settlement, Withdrawal
from herdsman.core.outcome import Outcome, RunOutcome
from herdsman.runtime.accounts import longest_window
from herdsman.runtime.reload import given_config
from herdsman.runtime.requests import settings_of, trace_run
from herdsman.runtime.runner.run_usage import RunUsage
from herdsman.runtime.store import NewRun
from herdsman.runtime.store.records import spend_json, spend_of
from herdsman.runtime.supervisor.outcomes import near_limit_mark, run_outcome
from herdsman.sim.fake_end import NO_ENDING, fake_end, finish_ending, stopped_end
from herdsman.sim.metrics import Metrics, figures, slots_of
from herdsman.sim.result import ReplayResult
from herdsman.sim.workload import (
    CARRIED_REST,
    Arrival,
    Attempt,
    Ending,
    Executions,
    RunPlan,
    Workload,
    config_from_trace,
    late_wake,
)
from herdsman.trace import TraceWriter

__all__ = ["FastEngine", "fast_replay"]

# Read for every run submitted, bound once (an enum member read through its
# class costs five times a module global: see core/lifecycle.py).
_QUEUED, _SKIPPED = Admission.QUEUED, Admission.SKIPPED


class _Run:
    """A queued or running run: what the supervisor's record and task would hold."""

    __slots__ = (
        "began",
        "execution",
        "index",
        "outcome",
        "plan",
        "request",
        "since",
        "submitted",
        "usage",
        "waited",
    )

    def __init__(
        self, request: RunRequest, plan: RunPlan | None, index: int, submitted: float
    ) -> None:
        self.request = request
        self.plan = plan  # how its attempts go (None: not in the workload's plans)
        self.index = index  # arrival order: ties between ends at one instant
        self.submitted = submitted  # virtual time of the submit
        # Executions started so far: which one an end belongs to (a cancelled
        # one's is stale), and which of the plan's attempts the next one is.
        self.execution = 0
        self.outcome: RunOutcome | None = None  # how the attempt under way ends
        # What the attempt under way's agent says it spent (a synthetic spend), if anything.
        self.usage: RunUsage | None = None
        # For metrics, on the trace's clock (rounded as its ``t``): queued
        # since, the current attempt's start, and where its wait is kept in
        # the engine's waits (-1: never started).
        self.since = 0.0
        self.began = 0.0
        self.waited = -1


class _Ledger:
    """What the supervisor reads back from its ledger: limits in force and account usage.

    Only a reload that brings an account back reads it (its rest and window
    usage are restored, as at a restart), so it is kept only for workloads
    with reloads.
    """

    def __init__(self) -> None:
        # In submission order, as the store's; [provider, account, started, finished, running].
        self.uses: dict[str, list[Any]] = {}
        # Earlier attempts of re-queued runs, by run then attempt, as uses.
        self.earlier: dict[str, list[list[Any]]] = {}
        self.limits: dict[tuple[str, str | None], tuple[float, str]] = {}

    def started(self, run_id: str, provider: str, account: str | None, now: float) -> None:
        self.uses[run_id] = [provider, account, now, None, True]

    def finished(self, run_id: str, now: float, *, spawned: bool = True) -> None:
        if not spawned:
            # Ended without an exit code: never spawned, spent nothing, and
            # the store's account_usage leaves it out.
            self.uses.pop(run_id, None)
            return
        use = self.uses.get(run_id)
        if use is not None:
            use[3], use[4] = now, False

    def requeued(self, run_id: str, now: float, *, spawned: bool, moved: bool) -> None:
        # The store keeps the attempt (run_attempts) and account_usage counts
        # it: ended, if it got a process or was moved off its account.
        use = self.uses.pop(run_id, None)
        if use is not None and (spawned or moved):
            use[3], use[4] = now, False
            self.earlier.setdefault(run_id, []).append(use)

    def usage(self, since: float) -> list[tuple[str, str | None, float, float | None]]:
        """``Store.account_usage``: runs on a named account started or ended since ``since``."""
        used = [
            (use[0], use[1], use[2], use[3])
            for use in (*self.uses.values(), *chain.from_iterable(self.earlier.values()))
            if use[1] is not None
            and (use[2] >= since or (use[3] is not None and use[3] >= since) or use[4])
        ]
        used.sort(key=lambda use: use[2])  # stable: ties stay in submission order
        return used

    def limits_after(self, now: float) -> list[tuple[str, str | None, float, str]]:
        """``Store.account_limits``: rests still in force, in the store's order."""
        return sorted(
            (
                (provider, account, until, message)
                for (provider, account), (until, message) in self.limits.items()
                if until > now
            ),
            key=lambda limit: (limit[0], limit[1] is not None, limit[1] or ""),
        )


class FastEngine:
    """One simulation of ``workload`` under ``loaded``; call :meth:`run` once.

    ``trace``: write the simulated trace (header and events, as the trio
    replay writes it); without it only the figures are kept, which is what
    capacity planning wants. ``waits``: keep the queue wait of every start
    (seconds from the run's submit), in start order, in :attr:`waits`, and
    the account it started on in :attr:`picks`. ``metrics``: add up, as
    events happen, what :func:`~herdsman.sim.metrics.measure` reads from
    the trace, for :meth:`metrics` — the very same figures, with no trace
    text written or parsed (what ``sim plan`` does).
    """

    def __init__(
        self,
        workload: Workload,
        loaded: LoadedConfig,
        *,
        trace: bool = True,
        waits: bool = False,
        metrics: bool = False,
    ) -> None:
        self._workload = workload
        # Made again from its JSON, as the trio replay does: both engines then
        # start from the very same settings and report reloads against them.
        self._loaded = config_from_trace(config_as_json(loaded.config), "configuration")
        config = self._loaded.config
        self._config: Config = config
        self._life = Lifecycle(settings_of(config))
        self._executions = Executions(workload)
        self._origin = workload.started_at
        self._now = 0.0
        # Run ends: (time, arrival order, push count, run id, execution).
        self._ends: list[tuple[float, int, int, str, int]] = []
        self._pushes = 0
        self._runs: dict[str, _Run] = {}  # queued or running
        # Runs whose submit waits for a sweep's removal: their busy keys.
        self._held: dict[str, tuple[str, ...]] = {}
        self._plans = workload.plans  # a run's arrival order is its plan's index
        self._stopped = False
        self._drain_asked = False
        # The dispatcher's next look at resting accounts, or the shutdown grace.
        self._timer: float | None = None
        self._generation = 1
        # What the fake runner reports, one per distinct ending (as the trio
        # replay's fake runner hands one outcome to every run that ends alike).
        self._outcomes: dict[Ending, RunOutcome] = {}
        self._ledger = _Ledger() if "reload" in workload.kinds else None
        self._out: io.StringIO | None = None
        self._trace: TraceWriter | None = None
        if trace:
            self._out = io.StringIO()
            self._trace = TraceWriter(
                Path("/herdsman-sim/traces"),
                max_bytes=1 << 62,
                sink=self._out,
                config=config_as_json(config),
                clock=lambda: self._now,
                wall=lambda: dt.datetime.fromtimestamp(self._wall(), dt.UTC),
            )
            self._trace.open()
        #: Runs submitted (created in the ledger, queued or skipped).
        self.runs = 0
        #: Queue waits of every start, if asked for.
        self.waits: list[float] | None = [] if waits else None
        #: The account of every start, with the waits.
        self.picks: list[str | None] = []
        self._measuring = metrics
        self._slots = slots_of(config_as_json(config)) if metrics else 0
        # Now on the trace's clock (an event's ``t``, rounded as the trace
        # rounds it), kept with the clock while measuring: the loop sets both
        # as it moves to a moment, once for every event there (a rounding
        # costs more than the rest of an event's measuring).
        self._rounded = 0.0
        # What measure() adds up, on the trace's clock: the last event's
        # time, runs submitted, started (in first-start order) and withdrawn
        # before any start, run-seconds busy, ends for good, timeouts, limits.
        self._last = 0.0
        self._submitted = 0
        # Each started run's wait, by first start: floats, not the runs, so
        # that finished runs are freed (the collector would walk them all).
        self._waited: list[float] = []
        self._withdrawn = 0
        self._busy = 0.0
        self._finished = 0
        self._timeouts = 0
        self._limits = 0
        # What the agents spent, as the finish events' ``spend`` adds up.
        self._tokens = 0
        self._usd = 0.0

    # -- results -------------------------------------------------------------

    @property
    def now(self) -> float:
        """Virtual seconds since the trace's header."""
        return self._now

    @property
    def text(self) -> str:
        """The simulated trace ("" without ``trace``)."""
        return self._out.getvalue() if self._out is not None else ""

    def metrics(self) -> Metrics:
        """The simulation's figures, as :func:`~herdsman.sim.metrics.measure` reads
        them from its trace; needs ``metrics`` and a finished :meth:`run`."""
        if not self._measuring:
            raise ValueError("metrics() needs FastEngine(..., metrics=True)")
        return figures(
            list(self._waited),
            busy=self._busy,
            end=self._last,
            slots=self._slots,
            ended=self._finished,
            usage_limited=self._limits,
            timeouts=self._timeouts,
            unstarted=self._submitted - len(self._waited) - self._withdrawn,
            tokens=self._tokens,
            usd=self._usd,
        )

    @property
    def left_queued(self) -> int:
        """Runs still queued, as the supervisor's status counts them.

        A run waiting out a retry's backoff is queued in the ledger (held by
        the scheduler): one a drain caught there is left queued too.
        """
        life = self._life
        held = life.scheduler.held_runs()
        retrying = sum(1 for run in held if life.backoff_of(run.id) is not None)
        return life.queued_count + retrying

    @property
    def defaulted(self) -> tuple[str, ...]:
        """Runs the recording never started, given the default duration."""
        return tuple(self._executions.defaulted)

    # -- the loop --------------------------------------------------------------

    def run(self) -> None:
        """Deliver every event in order until nothing more can happen."""
        arrivals = self._workload.arrivals
        count = len(arrivals)
        ends = self._ends
        runs = self._runs
        life = self._life
        scheduler = life.scheduler
        position, inf = 0, math.inf
        # The next arrival's time, worked out as it becomes the next, not
        # again at every run's end and timer before it.
        arrival_at = arrivals[0].t if count else inf
        while True:
            end_at = ends[0][0] if ends else inf
            timer = self._timer
            if timer is not None and timer <= end_at and timer <= arrival_at:
                # The supervisor's own timers due by a moment act before it.
                self._fire(timer, min(end_at, arrival_at))
            elif end_at <= arrival_at:
                if end_at == inf:
                    # Nothing left to happen: no input, no run, and no
                    # account timer (the trio driver stops here too).
                    return
                at, _, _, run_id, execution = heapq.heappop(ends)
                self._now = at
                if self._measuring:
                    self._rounded = round(at, 6)
                run = runs.get(run_id)
                if run is not None and run.execution == execution:  # else cancelled before
                    assert run.outcome is not None
                    self._settle(run, run.outcome)
                    if scheduler.queued_count or life.waiting:  # queued, or a backoff
                        self._dispatch()
                    elif life.admitting:
                        self._timer = None  # nothing waits, for an account or else
            else:
                arrival = arrivals[position]
                position += 1
                arrival_at = arrivals[position].t if position < count else inf
                self._now = arrival.t
                if self._measuring:
                    # The trace's clock now, as the arrival has it worked out.
                    self._rounded = arrival.trace_t
                if arrival.kind == "submit" and life.admitting and "account" not in arrival.fields:
                    # The hot path: only the new run can have become startable,
                    # and only if the scheduler's ready index holds its provider
                    # (a resting account is the dispatcher's business: it must
                    # look). Else the supervisor's submit still wakes its
                    # dispatcher to set its timer again, and so does this.
                    provider = self._submit(arrival, skip=False)
                    if provider is not None:
                        if provider in scheduler.startable:
                            self._dispatch()
                        elif self._timer is not None or life.may_wake_in_time:
                            self._rearm(self._origin + self._now)
                else:
                    self._arrive(arrival)
                    self._dispatch()

    def _fire(self, timer: float, next_event: float) -> None:
        """The dispatcher's timer, or the shutdown grace's, fires: due at ``timer``, and
        late (up to ``next_event``), as recorded, if a start says its dispatcher decided so."""
        self._timer = None
        life = self._life
        wakes = self._workload.wakes
        if wakes and life.admitting:  # never the shutdown grace
            timer = late_wake(wakes, timer, next_event)
        self._now = max(self._now, timer)
        if self._measuring:
            self._rounded = round(self._now, 6)
        if life.admitting:
            self._dispatch()
        else:
            self._force()

    def _wall(self) -> float:
        return self._origin + self._now

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._measuring:
            self._last = self._rounded
        if self._trace is not None:
            self._trace.event(kind, **fields)

    # -- the dispatcher --------------------------------------------------------

    def _dispatch(self) -> None:
        """``Dispatcher._start_what_may_start``, then when to look at accounts again."""
        life = self._life
        if not life.admitting:
            return
        now = self._origin + self._now  # _wall(), on every dispatch
        for run_id, pick in life.take_starts(now).items():
            self._start(run_id, pick.account, now)
        # _rearm(now), inlined: every dispatch sets the timer again. The time
        # is read already, so next_wakeup answers alone (may_wake_in_time
        # would only ask its first question again).
        at = life.next_wakeup(now)
        self._timer = None if at is None else self._now + max(0.0, at - now)

    def _rearm(self, now: float) -> None:
        """When the supervisor's dispatcher looks at resting accounts again, from ``now``.

        (It also looks every minute; those looks find nothing new, since only
        time frees an account and this is when, so they are left out.) Its
        one caller, a submit, does not call it while no timer is set and
        ``may_wake_in_time`` says time alone frees no account and ends no
        backoff. Worked out from the moment it is set, as the dispatcher's
        deadline is.
        """
        at = self._life.next_wakeup(now)
        self._timer = None if at is None else self._now + max(0.0, at - now)

    def _start(self, run_id: str, account: str | None, now: float) -> None:
        run = self._runs[run_id]
        run.execution += 1
        if self._trace is not None:
            self._trace.event("start", run_id=run_id, account=account)
        if self.waits is not None:
            self.waits.append(self._now - run.submitted)
            self.picks.append(account)
        if self._measuring:
            self._last = t = self._rounded
            run.began = t
            # Added up in measure()'s order, so the floats come out the same.
            if run.waited < 0:
                run.waited = len(self._waited)
                self._waited.append(0.0 + t - run.since)
            else:
                self._waited[run.waited] = self._waited[run.waited] + t - run.since
        if self._ledger is not None:
            self._ledger.started(run_id, run.request.provider, account, now)
        attempt = self._executions.attempt(run_id, run.plan, run.execution - 1)
        # How the fake runner will report its end: one outcome per distinct
        # ending, as the trio replay's fake runner hands them out.
        key = attempt.shared_end
        if key is None:
            outcome = _outcome(attempt)  # its own: what its agent's stream said
        else:
            shared = self._outcomes.get(key)
            if shared is None:
                shared = self._outcomes[key] = _outcome(attempt)
            outcome = shared
        run.outcome = outcome
        run.usage = attempt.usage
        self._pushes += 1
        heapq.heappush(
            self._ends,
            (attempt.end(self._now), run.index, self._pushes, run_id, run.execution),
        )

    # -- a run's end -----------------------------------------------------------

    def _settle(self, run: _Run, outcome: RunOutcome) -> None:
        """Settle a run's end through the lifecycle; trace and measure what it decided."""
        run_id = run.request.id
        now = self._origin + self._now  # _wall()
        life = self._life
        account = None
        signals = outcome.account
        if signals is not None and signals.near_limit:
            account = life.book.holding(run_id)
        settled = life.finish(run_id, outcome, now)
        if signals is not None and signals.near_limit:
            self._warned(run_id, run.request.provider, account, now)
        if settled.retry is not None:
            self._retried(run, outcome, settled, now)
        elif settled.freed:
            del self._runs[run_id]
            if self._ledger is not None:
                self._ledger.finished(run_id, now, spawned=settled.spawned)
            if self._measuring:
                self._measure_finish(run, settled.status, requeued=False)
            if settled.login is not None:
                self._login(run_id, settled.login)
            if run.usage is not None:
                ending = finish_ending(outcome)
                self._spent(run.usage, run_id, settled.status.value, outcome.exit_code, ending)
            elif self._trace is not None:
                self._trace.event(
                    "finish",
                    run_id=run_id,
                    outcome=settled.status.value,
                    exit_code=outcome.exit_code,
                    **finish_ending(outcome),
                )
        else:
            self._limited(run, outcome, settled, now)
        if self._drain_asked and not life.running_count:
            self._stopped = True  # drained: the supervisor stops
            self._timer = None

    def _limited(self, run: _Run, outcome: RunOutcome, settled: Settlement, now: float) -> None:
        """A finish at a usage limit: recorded, then re-queued or freed, and its account rested."""
        run_id = run.request.id
        requeue = settled.requeue
        self._life.settle(run_id, now, requeued=requeue)
        ledger = self._ledger
        if ledger is not None:
            if requeue:
                ledger.requeued(run_id, now, spawned=settled.spawned, moved=True)
            else:
                ledger.finished(run_id, now, spawned=settled.spawned)
        if not requeue:
            del self._runs[run_id]
        rest = settled.rest
        if rest is not None:
            self._limits += 1
            if ledger is not None:
                ledger.limits[(rest.provider, rest.account)] = (rest.until, rest.message)
            self._emit(
                "usage_limit",
                run_id=run_id,
                provider=rest.provider,
                account=rest.account,
                until=rest.until,
            )
        if settled.login is not None:
            self._login(run_id, settled.login)
        status = settled.status.value
        if self._measuring:
            self._measure_finish(run, status, requeued=requeue)
        ending = finish_ending(outcome)
        if requeue:
            self._requeued(run, run_id, status, outcome.exit_code, ending)
        elif run.usage is not None:
            self._spent(run.usage, run_id, status, outcome.exit_code, ending)
        elif self._trace is not None:
            self._emit(
                "finish", run_id=run_id, outcome=status, exit_code=outcome.exit_code, **ending
            )

    def _retried(self, run: _Run, outcome: RunOutcome, settled: Settlement, now: float) -> None:
        """A failed attempt its provider's policy tries again: traced, and re-queued as the
        supervisor does (``Execution._retried``, then the finish with what it spent)."""
        retry = settled.retry
        assert retry is not None
        run_id = run.request.id
        if self._ledger is not None:
            self._ledger.requeued(run_id, now, spawned=settled.spawned, moved=False)
        if self._measuring:
            self._measure_finish(run, settled.status, requeued=True)
        if self._trace is not None:
            self._trace.event(
                "retry",
                run_id=run_id,
                attempt=retry.attempt,
                failure=retry.failure.value,
                at=retry.at,
                delay=round(retry.delay, 6),
            )
        self._requeued(run, run_id, settled.status.value, outcome.exit_code, finish_ending(outcome))

    def _requeued(
        self,
        run: _Run,
        run_id: str,
        status: str,
        exit_code: int | None,
        ending: Mapping[str, Any] = NO_ENDING,
    ) -> None:
        """The finish of an attempt whose run is queued again, with what the attempt spent:
        the supervisor reports a re-queued attempt's spend with it (the ledger then clears it)."""
        spend = None if run.usage is None else spend_of(run.usage)
        spent: dict[str, Any] = {}
        if spend is not None:
            spent["spend"] = spend_json(spend)
            if self._measuring:
                # A re-queued attempt's spend counts, as measure() counts every finish's.
                if spend.tokens is not None:
                    self._tokens += spend.tokens.total
                if spend.cost_usd is not None:
                    self._usd += spend.cost_usd
        self._emit(
            "finish",
            run_id=run_id,
            outcome=status,
            exit_code=exit_code,
            **ending,
            requeued=True,
            **spent,
        )

    def _login(self, run_id: str, login: LoginNeeded) -> None:
        """The run's account needs a login: traced as the supervisor's tracker does."""
        self._emit(
            "needs_login",
            run_id=run_id,
            provider=login.provider,
            account=login.account,
            message=login.message,
        )

    def _warned(self, run_id: str, provider: str, account: str | None, now: float) -> None:
        """The run's stream warned its account is near its limit: traced as the supervisor does."""
        until = near_limit_mark(self._life.book, provider, account, now)
        if until is not None:
            self._emit("near_limit", run_id=run_id, provider=provider, account=account, until=until)

    def _spent(
        self,
        usage: RunUsage,
        run_id: str,
        status: str,
        exit_code: int | None,
        ending: Mapping[str, Any] = NO_ENDING,
    ) -> None:
        """A finish for good whose agent said what it spent: the spend the ledger records.

        ``spend_of`` is the supervisor's own reading of the stream (a re-queued
        attempt's is never recorded: the ledger clears it).
        """
        spend = spend_of(usage)
        if spend is None:
            if self._trace is not None:
                self._trace.event(
                    "finish", run_id=run_id, outcome=status, exit_code=exit_code, **ending
                )
            return
        if self._measuring:
            if spend.tokens is not None:
                self._tokens += spend.tokens.total
            if spend.cost_usd is not None:
                self._usd += spend.cost_usd
        if self._trace is not None:
            self._trace.event(
                "finish",
                run_id=run_id,
                outcome=status,
                exit_code=exit_code,
                **ending,
                spend=spend_json(spend),
            )

    def _measure_finish(self, run: _Run, status: str, *, requeued: bool) -> None:
        """Add up a finish event as ``measure`` does: busy time, and a re-queue or an end."""
        self._last = t = self._rounded
        self._busy += t - run.began
        if requeued:
            run.since = t  # waiting again, from now
        else:
            self._finished += 1
            self._timeouts += status == "timed_out"

    # -- arrivals --------------------------------------------------------------

    def _arrive(self, arrival: Arrival) -> None:
        kind = arrival.kind
        if self._stopped:
            # The supervisor has stopped: nothing reaches it any more (as
            # the trio replay's driver delivers nothing to a stopped one).
            return
        if kind == "submit" or kind == "skip":  # noqa: PLR1714 - the hot path
            if self._life.admitting:  # else refused, as a draining supervisor refuses it
                if "account" in arrival.fields:  # running on it when the file was rotated
                    self._life.pin(arrival.fields["run"]["id"], arrival.fields["account"])
                self._submit(arrival, skip=kind == "skip")
        elif kind == "cancel":
            self._cancel(arrival.fields["run_id"])
        elif kind == "reload":
            self._reload(arrival)
        elif kind == "shutdown":
            self._shutdown()
        elif kind == "rest":  # resting when the trace file was rotated
            self._rest(arrival.fields)
        elif kind == "rest_ended":
            self._end_rest(arrival.fields["provider"], arrival.fields["account"])
        elif kind == "removal_wait":
            self._hold(arrival)
        # A rejected reload changed nothing in the recording and changes nothing here.

    def _rest(self, fields: Mapping[str, Any]) -> None:
        """``Supervisor.rest_account``: rest a configured account until a time still ahead."""
        provider, account, until = fields["provider"], fields["account"], fields["until"]
        rested = self._life.rest(provider, account, until, CARRIED_REST, self._wall())
        if rested and self._ledger is not None:
            self._ledger.limits[(provider, account)] = (until, CARRIED_REST)

    def _end_rest(self, provider: str, account: str | None) -> None:
        """``Supervisor.end_rest``, traced as the supervisor traces it."""
        if not self._life.end_rest(provider, account):
            return
        if self._ledger is not None:
            self._ledger.limits.pop((provider, account), None)
        self._emit("rest_ended", provider=provider, account=account)

    def _hold(self, arrival: Arrival) -> None:
        """A submit that waited for a sweep's removal: its keys held until its submit.

        As the trio replay holds it (``_Feed._hold``): meanwhile a submit
        that skips finds its conversation (and agent) busy.
        """
        request = arrival.request
        assert request is not None  # a removal wait's run
        if not self._config.repos or not self._life.admitting or request.conversation is None:
            return  # a what-if without repositories: nothing to wait for
        agent_exclusive = self._config.scheduling.agent_exclusive
        self._held[request.id] = busy_keys(request, agent_exclusive=agent_exclusive)
        self._emit("removal_wait", run_id=request.id)

    def _submit(self, arrival: Arrival, *, skip: bool) -> str | None:
        """Record and queue a run (or skip it); its provider if it was queued."""
        request = arrival.request
        assert request is not None  # a submit's or a skip's
        run_id = request.id
        claimed = False
        if self._held:  # a submit waits for a removal (rarely: most replays never look)
            self._held.pop(run_id, None)
            if skip:
                keys = busy_keys(request, agent_exclusive=self._config.scheduling.agent_exclusive)
                claimed = any(not set(keys).isdisjoint(held) for held in self._held.values())
        admitted = self._life.submit(request, self._origin + self._now, skip, claimed=claimed)
        if admitted is _QUEUED:
            plan = self._plans.get(run_id)
            index = plan.index if plan is not None else len(self._plans)
            queued = self._runs[run_id] = _Run(request, plan, index, self._now)
            if self._measuring:
                self._submitted += 1
                # The trace's clock, as the loop set it from the arrival.
                self._last = queued.since = self._rounded
        elif admitted is _SKIPPED:
            if self._measuring:
                self._last = self._rounded  # the skip event, at the arrival's clock
        else:
            return None  # a repeated id is the run it already was
        self.runs += 1
        if self._trace is not None:
            new = NewRun(
                id=run_id,
                provider=request.provider,
                prompt=arrival.fields["run"].get("prompt", "(not recorded)"),
                conversation=request.conversation,
                agent=request.agent,
                workspace=request.workspace,
                cwd=request.cwd,
            )
            traced = trace_run(new, with_prompt=self._config.trace.record_prompts)
            self._emit("submit" if admitted is _QUEUED else "skip", run=traced)
        return request.provider if admitted is _QUEUED else None

    def _cancel(self, run_id: str) -> None:
        withdrawal = self._life.cancel(run_id)
        if withdrawal is Withdrawal.WITHDRAWN:
            if self._runs.pop(run_id).waited < 0 and self._measuring:
                self._withdrawn += 1  # measure() counts it neither started nor unstarted
            if self._ledger is not None:
                self._ledger.finished(run_id, self._wall())
            self._emit("cancel", run_id=run_id)
        elif withdrawal is Withdrawal.STOP:
            # Its process is stopped at once: it ends as the fake runner
            # reports a stopped attempt (``stopped_end``).
            self._stop(self._runs[run_id])
        # Unknown (ended, skipped, never submitted): nothing to cancel.

    def _shutdown(self) -> None:
        """A shutdown signal: the first drains, the next (or the grace ending) cancels."""
        if self._drain_asked:
            self._force()
            return
        self._drain_asked = True
        self._life.drain()
        self._emit("shutdown")
        if self._life.running_count:
            self._timer = self._now + self._config.supervisor.shutdown_grace.total_seconds()
        else:
            self._stopped = True
            self._timer = None

    def _force(self) -> None:
        """Cancel what still runs (in arrival order, as the trio replay ends them), and stop."""
        if self._stopped:
            return
        self._timer = None
        self._emit("shutdown", forced=True)
        scheduler = self._life.scheduler
        running = [
            run for run in self._runs.values() if scheduler.state_of(run.request.id) is RUNNING
        ]
        for run in sorted(running, key=lambda run: run.index):
            self._life.cancel(run.request.id)  # asked to stop, as the supervisor's stop asks
            self._stop(run)
        self._stopped = True

    def _stop(self, run: _Run) -> None:
        """Settle a run whose process a cancel stopped: as the recording ended it if it was
        cancelled there (its exit code, spend and session), else cut short, having said nothing."""
        attempt = self._executions.attempt(run.request.id, run.plan, run.execution - 1)
        if attempt.outcome != "cancelled":
            run.usage = None
            self._settle(run, STOPPED)
            return
        ended = stopped_end(attempt, None)
        run.usage = ended.usage
        self._settle(run, run_outcome(ended, ended.session_id is not None))

    # -- reloads ---------------------------------------------------------------

    def _reload(self, arrival: Arrival) -> None:
        """``Supervisor.reload_to``: apply every live change, all at once, or nothing."""
        written = config_from_trace(arrival.fields["config"], f"reload at t={arrival.t}")
        loaded, changes = given_config(written, self._loaded)
        if not any(change.live for change in changes):
            # Applied all the same: it logs every account in, traced if it freed one.
            if self._life.logged_in():
                config = config_as_json(loaded.config)
                self._emit("reload", generation=self._generation, config=config)
            return
        now = self._wall()
        settings = settings_of(loaded.config)
        returning = self._life.returning(settings)
        ledger = self._ledger
        assert ledger is not None  # kept for every workload with reloads
        # The windows that matter are the returning accounts', in the new config.
        window = longest_window(loaded.config)
        limits = ledger.limits_after(now) if returning else []
        uses = ledger.usage(now - window) if returning and window else []
        self._loaded, self._config = loaded, loaded.config
        self._life.reconfigure(settings, limits, uses)
        self._generation += 1
        self._emit("reload", generation=self._generation, config=config_as_json(loaded.config))


RUNNING = RunState.RUNNING

#: How a run ends that a cancel or a forced shutdown stopped: as the fake runner says it.
STOPPED = RunOutcome(Outcome.CANCELLED)


def _outcome(attempt: Attempt) -> RunOutcome:
    """What the supervisor makes of the end the trio replay's fake runner reports for
    ``attempt``: its failure class, spend and account signals, read as production reads them."""
    ended = fake_end(attempt, None)
    return run_outcome(ended, ended.session_id is not None)


def fast_replay(workload: Workload, loaded: LoadedConfig) -> ReplayResult:
    """Replay ``workload`` under ``loaded`` with the fast engine; the same result shape
    as :func:`herdsman.sim.replay.replay`, and the same decisions."""
    began = time.perf_counter()
    engine = FastEngine(workload, loaded)
    engine.run()
    return ReplayResult(
        engine.text,
        engine.runs,
        engine.now,
        time.perf_counter() - began,
        engine.defaulted,
        engine.left_queued,
        workload.rotated_at,
        engine="fast",
    )
