"""Property tests: the run lifecycle against a deliberately plain reference model of its rules.

The model (:class:`Model`) is written from the rules (docs/scheduling.md,
docs/accounts.md), not from the cores: lists of runs in submission order,
accounts as plain records, and scans. It knows:

* slots: a provider's cap (a provider without one has no slots), the global cap;
* lanes: no two running (or held) runs share an exclusion key or overlapping
  working directories; FIFO per key: no run starts before an earlier-submitted
  queued run it conflicts with; the earliest free run starts first, and a busy
  lane never holds up a free run (no head-of-line blocking);
* accounts: a start spends an available account (not resting, not needing a
  login, under its concurrency cap, under its budget in its window: runs
  started, or tokens or dollars that ended runs spent plus each running run
  at their mean): the conversation's last one if it can, else one not near
  its limit, then the fewest running, then the least share of its budget
  used, then config order; a run that never spawned gives its start back;
* retries: a failed attempt whose class its provider's policy retries (at
  most ``attempts`` attempts; a class not in ``after_work`` only if the
  agent did no work; never one asked to stop) is held, keeping its lanes,
  until its backoff ends (``backoff * 2**(n-1)``, capped, jittered to half
  or more), then heads its lanes again; the next wake-up includes it;
* finishes: a usage limit reported by a run that did not succeed rests its
  account until the reported reset (else its window, else an hour); a plain
  failure then counts as ``usage_limited`` and, at its first attempt and not
  asked to stop, goes back to its place in the queue — once; a run that
  failed to log in (and met no usage limit) marks its account as needing a
  login and moves the same way, recorded ``usage_limited``; a warning marks
  the account near its limit until its reset (else its window, else an
  hour); what a run spent counts unless it was re-queued;
* submits (a known id is known, ``on_busy = "skip"``), cancels (queued, held,
  running; a stop asked while a finish is being recorded is that attempt's
  only), holds, give-backs, reloads (caps, exclusivity, accounts removed
  and added: a removed account keeps its runs until they end; every login
  needed is over), drains, rests (an end of one ends a needed login and a
  warning too);
* a fleet's word on the accounts at each poll (``sync_accounts``): the runs
  other members started on an account count against its budget in its
  window as its own do (none without a window), the rests the ledger holds
  are exactly the rests in force (a rest it does not name is over), and
  accounts not configured here are ignored;
* runs the ledger has queued, adopted in their place by sequence number (a
  fleet's poll, a refused cancel: a known id too), runs that left the
  ledger's queue forgotten, and finishes that could not be recorded (lost:
  no rest, no re-queue).

:class:`LifecycleMachine` drives a real :class:`Lifecycle` and the model with the
same random events, takes the starts after every event as the drivers do, and
checks each named property on every start, before comparing everything else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from herdsman.core import Limits, RunRequest, busy_keys, exclusion_keys
from herdsman.core.accounts import DEFAULT_REST, MAX_REST, AccountSpec, AccountUse, sticky_key
from herdsman.core.lifecycle import Admission, Lifecycle, Settings, Settlement, Withdrawal
from herdsman.core.outcome import AccountSignals, Outcome, RunOutcome, RunStatus, UsageLimit
from herdsman.core.retry import Failure, RetryPolicy

PROVIDERS = ("p0", "p1", "px")  # px is never given slots
WORKSPACES = ("default", "w1")
CONVERSATIONS = (None, "c0", "c1", "c2")
AGENTS = (None, "a0", "a1")
CWDS = (None, None, "/r", "/r/a", "/r/b", "/s")
WINDOW = 100.0

#: Account set-ups a reload switches between: names kept, dropped and added.
#: Budgets in every unit but run-minutes (which time alone changes while runs run).
ACCOUNTS: tuple[dict[str, tuple[AccountSpec, ...]], ...] = (
    {
        "p0": (AccountSpec("a", concurrency=1), AccountSpec("b", window=WINDOW, budget=2)),
        "p1": (),
    },
    {
        "p0": (
            AccountSpec("b", window=WINDOW, budget=300, unit="tokens"),
            AccountSpec("e", window=WINDOW, budget=2.0, unit="usd"),
        ),
        "p1": (AccountSpec("c", concurrency=2),),
    },
    {
        "p0": (),
        "p1": (
            AccountSpec("c", window=WINDOW, budget=1),
            AccountSpec("d", window=WINDOW, budget=1.25, unit="usd"),
        ),
    },
)

caps_st = st.sampled_from((1, 2, 3, 0))
limits_st = st.builds(
    Limits,
    provider_caps=st.fixed_dictionaries({"p0": caps_st, "p1": caps_st}),
    global_cap=st.sampled_from((None, 3, 2, 1, 4)),
)
#: Retry policies a reload switches between: p1 and px never retry.
RETRIES: tuple[dict[str, RetryPolicy], ...] = (
    {},
    {
        "p0": RetryPolicy(
            3,
            frozenset({Failure.OVERLOADED, Failure.CRASH}),
            frozenset({Failure.CRASH}),
            10.0,
            25.0,
        )
    },
    {"p0": RetryPolicy(2, frozenset({Failure.RATE_LIMIT, Failure.OVERLOADED}), frozenset(), 60.0)},
)
settings_st = st.builds(
    Settings,
    limits_st,
    agent_exclusive=st.booleans(),
    accounts=st.sampled_from(ACCOUNTS),
    retries=st.sampled_from(RETRIES),
)
run_st = st.fixed_dictionaries(
    {
        "provider": st.sampled_from(("p0", "p1", "p0", "p1", "px")),
        "workspace": st.sampled_from(WORKSPACES),
        "conversation": st.sampled_from(CONVERSATIONS),
        "agent": st.sampled_from(AGENTS),
        "cwd": st.sampled_from(CWDS),
    }
)
# What an attempt's stream said of its account: tokens and dollars spent
# (dollars in binary fractions, so sums are exact), a warning (None, or when
# it resets: None for not said, in seconds from now), a refused login.
Signals = tuple[int | None, float | None, tuple[float | None] | None, bool]
signals_st = st.tuples(
    st.sampled_from((None, 40, 200)),
    st.sampled_from((None, 0.5, 1.25)),
    st.tuples(st.sampled_from((None, 30.0, 500.0, -5.0))) | st.none(),
    st.booleans(),
)
# How an attempt ends: a status, whether a process was spawned, a usage limit
# (None, or when it resets: None for not said, in seconds from now), a
# session, and what the stream said of the account (None: nothing).
# Usage limits are made common: re-queueing once needs two in a row.
# Then the class of its failure (a retry policy's), and whether the agent
# may have done some work.
Ending = tuple[
    Outcome, bool, tuple[float | None] | None, bool, Signals | None, Failure | None, bool
]
ending_st = st.tuples(
    st.sampled_from((Outcome.FAILED, Outcome.SUCCEEDED, Outcome.TIMED_OUT, Outcome.CANCELLED)),
    st.booleans(),
    st.tuples(st.sampled_from((30.0, None, -5.0, 500.0, 1e9))) | st.none(),
    st.booleans(),
    st.none() | signals_st,
    st.sampled_from((None, Failure.OVERLOADED, Failure.CRASH, Failure.RATE_LIMIT)),
    st.booleans(),
)
#: Names a fleet's ledger may give: configured here or not, by some set-up.
LEDGER_PROVIDERS = ("p0", "p1", "px", "p9")
LEDGER_ACCOUNTS = ("a", "b", "c", "d", "z")
# A rest in the ledger is one in force: it ends after the poll, the window's
# edge (100 s) among the times; one per account.
ledger_rest_st = st.tuples(
    st.sampled_from(("p0", "p1", *LEDGER_PROVIDERS)),
    st.sampled_from((*LEDGER_ACCOUNTS, None)),
    st.sampled_from((1.0, 50.0, 300.0)),
    st.sampled_from(("out of quota", "by hand", "elsewhere")),
)
# Another member's run: its start, seconds before the poll (100: on the
# window's edge), and its end after the start (None: still running).
ledger_use_st = st.tuples(
    st.sampled_from(LEDGER_PROVIDERS),
    st.sampled_from(LEDGER_ACCOUNTS),
    st.sampled_from((0.0, 10.0, 60.0, 99.0, 100.0, 150.0)),
    st.sampled_from((None, 0.0, 5.0)),
)


@dataclass
class Account:
    """An account as the model keeps it: its spec, runs, starts in its window, rest.

    ``elsewhere``: other fleet members' runs on it, (start, end or None), as
    the last poll gave them.
    """

    spec: AccountSpec
    running: set[str] = field(default_factory=set)
    starts: list[float] = field(default_factory=list)
    # (end, tokens, dollars) of every run that ended here with a process while
    # the account had a window (None: the run did not say, or was re-queued).
    ended: list[tuple[float, int | None, float | None]] = field(default_factory=list)
    resting_until: float | None = None
    message: str | None = None
    near_until: float | None = None
    needs_login: str | None = None
    elsewhere: list[tuple[float, float | None]] = field(default_factory=list)

    def in_window(self, now: float) -> list[float]:
        """Starts in the window, here and elsewhere (none without a window)."""
        window = self.spec.window
        if window is None:
            return []
        return [t for t in self.starts + [s for s, _ in self.elsewhere] if t > now - window]

    def ends_in_window(self, now: float) -> list[tuple[float, int | None, float | None]]:
        """Runs that ended in the window, here and elsewhere (others' said nothing)."""
        window = self.spec.window
        if window is None:
            return []
        others = [(e, None, None) for _, e in self.elsewhere if e is not None]
        return [run for run in self.ended + others if run[0] > now - window]

    def usage(self, now: float) -> float:
        """Runs started in the window, or tokens or dollars spent, by any member of the fleet."""
        unit = self.spec.unit
        if unit == "runs":
            return float(len(self.in_window(now)))
        if self.spec.window is None:
            return 0.0
        spent = [
            (tokens if unit == "tokens" else usd) for _, tokens, usd in self.ends_in_window(now)
        ]
        figures = [amount for amount in spent if amount is not None]
        total = float(sum(figures))
        running = len(self.running) + sum(e is None for _, e in self.elsewhere)
        if running and figures:
            # Each running run at the mean of those that ended and said.
            total += running * (total / len(figures))
        return total

    def near(self, now: float) -> bool:
        return self.near_until is not None and self.near_until > now

    def available(self, now: float) -> bool:
        spec = self.spec
        if self.resting_until is not None and self.resting_until > now:
            return False
        if self.needs_login is not None:
            return False
        if spec.concurrency is not None and len(self.running) >= spec.concurrency:
            return False
        return spec.budget is None or self.usage(now) < spec.budget


@dataclass
class Model:
    """The rules, computed the slow and obvious way."""

    settings: Settings
    queued: list[RunRequest] = field(default_factory=list)  # submission order
    running: list[RunRequest] = field(default_factory=list)
    held: list[RunRequest] = field(default_factory=list)
    order: dict[str, int] = field(default_factory=dict)  # id -> submission number
    seen: set[str] = field(default_factory=set)
    admitting: bool = True
    # (provider, name) -> account, configured or kept by its running runs.
    accounts: dict[tuple[str, str | None], Account] = field(default_factory=dict)
    holds: dict[str, tuple[tuple[str, str | None], float]] = field(default_factory=dict)
    last: dict[tuple[str, str], str | None] = field(default_factory=dict)
    started_before: set[str] = field(default_factory=set)  # re-queued after a limit
    # Held runs waiting out a backoff: id -> when it ends.
    backoff: dict[str, float] = field(default_factory=dict)
    # Starts before the current attempt, for runs with any.
    attempts: dict[str, int] = field(default_factory=dict)
    stopping: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.configure(self.settings)

    # -- accounts ----------------------------------------------------------

    def names(self, provider: str) -> list[str | None]:
        specs = self.settings.accounts.get(provider)
        if specs is None:
            return []
        return [spec.name for spec in specs] or [None]

    def configured(self, provider: str) -> list[Account]:
        return [self.accounts[provider, name] for name in self.names(provider)]

    def configure(self, new: Settings) -> None:
        self.settings = new
        wanted = {(p, n) for p in new.accounts for n in self.names(p)}
        for key in list(self.accounts):
            if key not in wanted and not self.accounts[key].running:
                del self.accounts[key]  # gone, and nothing holds it: forgotten
        for provider, specs in new.accounts.items():
            for spec in specs or (AccountSpec(None),):
                kept = self.accounts.get((provider, spec.name))
                if kept is None:
                    self.accounts[provider, spec.name] = Account(spec)
                else:
                    kept.spec = spec

    def pick(self, run: RunRequest, now: float) -> str | None:
        accounts = [a for a in self.configured(run.provider) if a.available(now)]
        assert accounts, "no account, yet a start"
        if run.conversation is not None:
            key = (run.provider, sticky_key(run.workspace, run.conversation))
            if key in self.last and any(a.spec.name == self.last[key] for a in accounts):
                return self.last[key]
        everyone = self.configured(run.provider)

        def rank(account: Account) -> tuple[bool, int, float, int]:
            budget = account.spec.budget
            share = 0.0 if budget is None else account.usage(now) / budget
            return (account.near(now), len(account.running), share, everyone.index(account))

        return min(accounts, key=rank).spec.name

    def give_back(
        self,
        run_id: str,
        *,
        spawned: bool,
        now: float | None = None,
        spent: tuple[int | None, float | None] = (None, None),
    ) -> None:
        """The run ended (at ``now``, having ``spent``), or never started (no ``now``)."""
        key, started = self.holds.pop(run_id)
        account = self.accounts[key]
        account.running.discard(run_id)
        if not spawned and started in account.starts:
            account.starts.remove(started)
        if spawned and now is not None and account.spec.window is not None:
            account.ended.append((now, *spent))
        if not account.running and key[1] not in self.names(key[0]):
            del self.accounts[key]

    # -- lanes -------------------------------------------------------------

    def conflicts(self, a: RunRequest, b: RunRequest) -> bool:
        exclusive = self.settings.agent_exclusive
        if set(exclusion_keys(a, agent_exclusive=exclusive)) & set(
            exclusion_keys(b, agent_exclusive=exclusive)
        ):
            return True
        if a.cwd is None or b.cwd is None:
            return False
        pa, pb = PurePosixPath(a.cwd), PurePosixPath(b.cwd)
        return pa == pb or pa in pb.parents or pb in pa.parents

    def why_not(self, run: RunRequest, now: float) -> str | None:
        """Which rule keeps a queued run from starting now (None: it may start)."""
        caps = self.settings.limits
        if sum(r.provider == run.provider for r in self.running) >= caps.provider_caps.get(
            run.provider, 0
        ):
            return "its provider has no free slot"
        if caps.global_cap is not None and len(self.running) >= caps.global_cap:
            return "the global cap is reached"
        if any(self.conflicts(run, other) for other in self.running + self.held):
            return "a running or held run shares its lane"
        earlier = self.queued[: self.queued.index(run)]
        if any(self.conflicts(run, other) for other in earlier):
            return "an earlier queued run shares its lane (FIFO)"
        if not any(a.available(now) for a in self.configured(run.provider)):
            return "no account of its provider is available"
        return None

    def end_backoffs(self, now: float) -> None:
        """Runs whose backoff is over go back to their place (while admitting)."""
        if not self.admitting:
            return
        for run in list(self.held):
            at = self.backoff.get(run.id)
            if at is not None and at <= now:
                del self.backoff[run.id]
                self.held.remove(run)
                self.requeue(run)

    def forget_attempts(self, run_id: str) -> None:
        self.attempts.pop(run_id, None)
        self.backoff.pop(run_id, None)

    def free(self, now: float) -> list[RunRequest]:
        if not self.admitting:
            return []
        return [run for run in self.queued if self.why_not(run, now) is None]

    # -- events ------------------------------------------------------------

    def submit(self, run: RunRequest, *, skip: bool) -> Admission:
        if not self.admitting:
            return Admission.REFUSED
        if run.id in self.seen:
            return Admission.KNOWN
        self.seen.add(run.id)
        if skip and any(self._busy(run, other) for other in self.queued + self.running + self.held):
            return Admission.SKIPPED
        self.order[run.id] = max(self.order.values(), default=-1) + 1
        self.queued.append(run)
        return Admission.QUEUED

    def _busy(self, run: RunRequest, other: RunRequest) -> bool:
        """Whether ``other`` shares ``run``'s conversation or agent (not its directory)."""
        exclusive = self.settings.agent_exclusive
        return bool(
            set(busy_keys(run, agent_exclusive=exclusive))
            & set(busy_keys(other, agent_exclusive=exclusive))
        )

    def start(self, run: RunRequest, account: str | None, now: float) -> None:
        self.queued.remove(run)
        self.running.append(run)
        held = self.accounts[run.provider, account]
        held.running.add(run.id)
        if held.spec.window is not None:  # only a window counts starts
            held.starts.append(now)
        self.holds[run.id] = ((run.provider, account), now)

    def requeue(self, run: RunRequest) -> None:
        self.queued = sorted([*self.queued, run], key=lambda r: self.order[r.id])

    def sync_accounts(
        self,
        rests: list[tuple[str, str | None, float, str]],
        uses: list[tuple[str, str, float, float | None]],
        now: float,
    ) -> list[tuple[str, str | None, float | None]]:
        """The fleet's rests and others' runs, for every account this model knows.

        Returns the rests that changed: configured accounts in config order,
        then those only running runs keep, by name.
        """
        configured = [(p, n) for p in self.settings.accounts for n in self.names(p)]
        kept = sorted(set(self.accounts) - set(configured), key=lambda k: (k[0], k[1] or ""))
        wanted = {(p, n): (until, message) for p, n, until, message in rests}
        changes: list[tuple[str, str | None, float | None]] = []
        for key in configured + kept:
            account = self.accounts[key]
            account.elsewhere = [(s, e) for p, n, s, e in uses if (p, n) == key]
            rest = wanted.get(key)
            if rest is not None:
                if (account.resting_until, account.message) != rest:
                    changes.append((*key, rest[0]))
                account.resting_until, account.message = rest
            else:
                if account.resting_until is not None and account.resting_until > now:
                    changes.append((*key, None))  # ended elsewhere before its time
                account.resting_until = account.message = None
        return changes


def rest_until(account: Account, now: float, resets_at: float | None) -> float:
    if resets_at is None or not math.isfinite(resets_at) or not now < resets_at <= now + MAX_REST:
        return now + (account.spec.window or DEFAULT_REST)
    return resets_at


def signals_of(said: Signals | None, now: float) -> AccountSignals | None:
    """What an attempt's stream said of its account, drawn as ``said``, at ``now``."""
    if said is None:
        return None
    tokens, usd, warned, refused = said
    return AccountSignals(
        tokens,
        usd,
        near_limit=warned is not None,
        near_limit_until=None if warned is None or warned[0] is None else now + warned[0],
        needs_login="refused" if refused else None,
    )


def conversation_key(run: RunRequest) -> str | None:
    return None if run.conversation is None else sticky_key(run.workspace, run.conversation)


class LifecycleMachine(RuleBasedStateMachine):
    """Random events against the lifecycle and the model; they must never disagree."""

    def __init__(self) -> None:
        super().__init__()
        self.life: Lifecycle
        self.model: Model
        self.now = 1000.0
        self.ids = 0
        self.starts: dict[str, int] = {}  # run id -> starts so far
        self.requeues: dict[str, int] = {}  # run id -> usage-limit re-queues
        # Each queued run's request and sequence number, as its first submit gave them.
        self.requests: dict[str, tuple[RunRequest, int]] = {}
        # Pairs of runs that shared a lane when a reload made it one.
        self.shared: set[frozenset[str]] = set()

    @initialize(config=settings_st, runs=st.lists(run_st, min_size=2, max_size=8))
    def begin(self, config: Settings, runs: list[dict[str, str | None]]) -> None:
        """A lifecycle with a backlog: runs to start, finish and re-queue from the first step."""
        self.life = Lifecycle(config)
        self.model = Model(config)
        for fields in runs:
            run, self.ids = RunRequest(f"r{self.ids}", **fields), self.ids + 1  # type: ignore[arg-type]
            assert self.life.submit(run, self.now) is self.model.submit(run, skip=False)
            self.note(run)
        self.take()

    # -- plumbing ----------------------------------------------------------

    def note(self, run: RunRequest) -> None:
        """Remember a run just queued by its first submit: what adopting it again takes."""
        seq = self.life.scheduler.seq_of(run.id)
        if seq is not None and run.id not in self.requests:
            self.requests[run.id] = (run, seq)

    def take(self) -> None:
        """Take the starts as a driver does after every event, checking each rule on each."""
        model, now = self.model, self.now
        model.end_backoffs(now)
        for run_id, pick in self.life.take_starts(now).items():
            # At most once per attempt: a second start only after a re-queue.
            self.starts[run_id] = self.starts.get(run_id, 0) + 1
            assert self.starts[run_id] <= 1 + self.requeues.get(run_id, 0), (
                f"{run_id} started {self.starts[run_id]} times"
            )
            [run] = [r for r in model.running + model.held + model.queued if r.id == run_id]
            assert run in model.queued, f"started {run_id}, which is not queued"
            why = model.why_not(run, now)
            # Each named property first, so a broken rule says which it is.
            assert why != "its provider has no free slot", f"{run_id} started over its cap"
            assert why != "the global cap is reached", f"{run_id} started over the global cap"
            assert why != "a running or held run shares its lane", f"{run_id} broke its lane"
            assert why != "an earlier queued run shares its lane (FIFO)", f"{run_id} broke FIFO"
            account = model.accounts.get((run.provider, pick.account))
            assert account is not None, f"{run_id} started on unknown account {pick.account}"
            assert account.resting_until is None or account.resting_until <= now, (
                f"{run_id} started on {pick.account}, which rests until {account.resting_until}"
            )
            assert account.available(now), f"{run_id} started on {pick.account}, over its limits"
            # The earliest free run goes first, on the account the rules pick.
            assert model.free(now)[0] is run, f"{run_id} started before {model.free(now)[0].id}"
            assert pick.account == model.pick(run, now), f"{run_id} got {pick.account}"
            model.start(run, pick.account, now)
        # No head-of-line blocking: whatever may start has started.
        assert not model.free(now), f"{[r.id for r in model.free(now)]} may start, not started"

    def pick_run(self, data: st.DataObject, runs: list[RunRequest]) -> RunRequest:
        return data.draw(st.sampled_from(sorted(runs, key=lambda r: r.id)))

    # -- rules -------------------------------------------------------------

    @rule(
        runs=st.lists(st.tuples(run_st, st.booleans(), st.booleans()), min_size=1, max_size=3),
        data=st.data(),
    )
    def submit(
        self, runs: list[tuple[dict[str, str | None], bool, bool]], data: st.DataObject
    ) -> None:
        """A few runs (``skip``: on_busy = "skip"; ``again``: an id given before)."""
        for fields, skip, again in runs:
            if again and self.model.seen:
                run_id = data.draw(st.sampled_from(sorted(self.model.seen)))
            else:
                run_id, self.ids = f"r{self.ids}", self.ids + 1
            run = RunRequest(run_id, **fields)  # type: ignore[arg-type]
            expected = self.model.submit(run, skip=skip)
            assert self.life.submit(run, self.now, skip) is expected
            if expected is Admission.QUEUED:
                self.note(run)
        self.take()

    @rule(seconds=st.sampled_from((1.0, 20.0, 60.0, 150.0, 4000.0)))
    def wait(self, seconds: float) -> None:
        self.now += seconds
        self.take()

    @precondition(lambda self: self.model.running)
    @rule(data=st.data(), ending=ending_st, recorded=st.booleans(), late_stop=st.booleans())
    def finish(self, data: st.DataObject, ending: Ending, recorded: bool, late_stop: bool) -> None:
        """One run ends; its finish recorded or not (lost), maybe asked to stop meanwhile."""
        self.end(self.pick_run(data, self.model.running), ending, recorded, late_stop)
        self.take()

    @precondition(lambda self: self.model.running)
    @rule(ending=ending_st, seconds=st.sampled_from((30.0, 100.0, 3600.0)))
    def finish_all(self, ending: Ending, seconds: float) -> None:
        """Every running run ends alike, then time passes: re-queues come round quickly."""
        for run in sorted(self.model.running, key=lambda r: r.id):
            self.end(run, ending)
        self.take()
        self.now += seconds
        self.take()

    def end(
        self, run: RunRequest, ending: Ending, recorded: bool = True, late_stop: bool = False
    ) -> None:
        """``run``'s attempt ends as ``ending`` says, in the lifecycle and in the model.

        ``recorded``: the driver recorded a usage limit's (or a needed
        login's) finish (else it reports the run lost); ``late_stop``: a
        cancel asked it to stop while its finish was being recorded.
        """
        model, now = self.model, self.now
        status, spawned, limit, session, said, failure, worked = ending
        resets_at = None if limit is None or limit[0] is None else now + limit[0]
        signals = signals_of(said, now)
        outcome = RunOutcome(
            status,
            0 if spawned else None,
            None if limit is None else UsageLimit(resets_at, "out of quota"),
            session,
            signals,
            failure,
            worked,
        )
        settled = self.life.finish(run.id, outcome, now)
        if settled.requeue and recorded:  # at most once per run, whatever the model says
            self.requeues[run.id] = self.requeues.get(run.id, 0) + 1
            assert self.requeues[run.id] == 1, f"{run.id} re-queued after a usage limit twice"
        key, _ = model.holds[run.id]
        account = model.accounts[key]
        stopped = run.id in model.stopping
        model.stopping.discard(run.id)
        spent = (None, None) if signals is None else (signals.tokens, signals.usd)
        login = self.marks(key, signals, refused=status is not Outcome.SUCCEEDED and limit is None)
        # The account the run holds is found even if a reload removed it since.
        hit = limit is not None and status is not Outcome.SUCCEEDED
        model.running.remove(run)
        conversation = conversation_key(run)
        if login:
            self.moved_for_login(
                run, ending, settled, stopped=stopped, recorded=recorded, late_stop=late_stop
            )
            return
        if not hit and self.retried(run, outcome, settled, stopped=stopped, spent=spent):
            return
        if hit:
            event(
                "usage limit on a re-queued run"
                if run.id in model.started_before
                else "usage limit"
            )
            until = rest_until(account, now, resets_at)
            final = RunStatus.USAGE_LIMITED if status is Outcome.FAILED else RunStatus(status)
            requeue = (
                final is RunStatus.USAGE_LIMITED
                and run.id not in model.started_before
                and not stopped
            )
            assert (settled.status, settled.requeue, settled.freed) == (final, requeue, False)
            assert settled.rest is not None
            assert (settled.rest.account, settled.rest.until) == (key[1], until)
            if not self.settles(run, recorded=recorded, late_stop=late_stop):
                return
            self.life.settle(run.id, now, requeued=requeue)
            account.resting_until, account.message = until, "out of quota"
            if requeue:
                model.started_before.add(run.id)
                model.attempts[run.id] = model.attempts.get(run.id, 0) + 1
                model.give_back(run.id, spawned=True, now=now)  # re-queued: nothing charged
                model.requeue(run)
            else:
                model.started_before.discard(run.id)  # it ended: adopted again, it is new
                model.forget_attempts(run.id)
                model.give_back(run.id, spawned=spawned, now=now, spent=spent)
        else:
            assert (settled.status, settled.requeue, settled.freed) == (
                RunStatus(status),
                False,
                True,
            )
            model.started_before.discard(run.id)
            model.forget_attempts(run.id)
            model.give_back(run.id, spawned=spawned, now=now, spent=spent)
        if session and conversation is not None:  # recorded: its session sticks
            model.last[run.provider, conversation] = key[1]

    def settles(self, run: RunRequest, *, recorded: bool, late_stop: bool) -> bool:
        """Whether a finish that waits to be settled is; else the run is lost.

        ``late_stop``: a cancel asks it to stop meanwhile. Not ``recorded``:
        neither rested nor re-queued, the ledger holds it running until it
        is lost.
        """
        model, now = self.model, self.now
        if late_stop:
            assert self.life.cancel(run.id) is Withdrawal.STOP
        if recorded:
            return True
        assert self.life.lost(run.id, now)
        model.give_back(run.id, spawned=True, now=now)
        model.started_before.discard(run.id)
        model.forget_attempts(run.id)
        return False

    def marks(
        self, key: tuple[str, str | None], signals: AccountSignals | None, *, refused: bool
    ) -> bool:
        """A warning marks an account still configured; whether a refused login moves the run.

        ``refused``: the run did not succeed and met no usage limit, so a
        refused login counts.
        """
        model = self.model
        if signals is None or key[1] not in model.names(key[0]):
            return False
        if signals.near_limit:
            event("warned near its limit")
            account = model.accounts[key]
            account.near_until = rest_until(account, self.now, signals.near_limit_until)
        return refused and signals.needs_login is not None

    def moved_for_login(
        self,
        run: RunRequest,
        ending: Ending,
        settled: Settlement,
        *,
        stopped: bool,
        recorded: bool,
        late_stop: bool,
    ) -> None:
        """:meth:`end` of a run refused its login: its account needs one; it moves, once."""
        model, now = self.model, self.now
        status, spawned, _, session, said, _, _ = ending
        spent = (None, None) if said is None else (said[0], said[1])
        key, _ = model.holds[run.id]
        conversation = conversation_key(run)
        event("needs login")
        model.accounts[key].needs_login = "refused"
        requeue = run.id not in model.started_before and not stopped
        final = RunStatus.USAGE_LIMITED if requeue else RunStatus(status)
        assert (settled.status, settled.requeue, settled.freed) == (final, requeue, not requeue)
        assert settled.rest is None
        assert settled.login is not None
        assert (settled.login.account, settled.login.message) == (key[1], "refused")
        if not requeue:
            if session and conversation is not None:
                model.last[run.provider, conversation] = key[1]
            model.started_before.discard(run.id)
            model.forget_attempts(run.id)
            model.give_back(run.id, spawned=spawned, now=now, spent=spent)
            return
        if not self.settles(run, recorded=recorded, late_stop=late_stop):
            return
        self.life.settle(run.id, now, requeued=True)
        model.attempts[run.id] = model.attempts.get(run.id, 0) + 1
        model.started_before.add(run.id)
        model.give_back(run.id, spawned=True, now=now)  # re-queued: nothing charged
        model.requeue(run)
        if session and conversation is not None:
            model.last[run.provider, conversation] = key[1]

    def retried(
        self,
        run: RunRequest,
        outcome: RunOutcome,
        settled: Settlement,
        *,
        stopped: bool,
        spent: tuple[int | None, float | None],
    ) -> bool:
        """Whether the model retries the attempt, checking the settlement's word on it."""
        model, now = self.model, self.now
        policy = model.settings.retries.get(run.provider)
        attempt = model.attempts.get(run.id, 0) + 1
        failure = outcome.failure
        retries = (
            outcome.status is not Outcome.SUCCEEDED
            and failure is not None
            and policy is not None
            and attempt < policy.attempts
            and failure in policy.on
            and (not outcome.worked or failure in policy.after_work)
            and not stopped
        )
        if not retries:
            assert settled.retry is None, f"{run.id} retried"
            return False
        assert policy is not None
        assert failure is not None
        event("retried")
        retry = settled.retry
        assert retry is not None, f"{run.id} not retried"
        base = min(policy.backoff_max, policy.backoff * 2 ** (attempt - 1))
        assert (retry.attempt, retry.failure) == (attempt, failure)
        assert base / 2 <= retry.delay <= base
        assert retry.at == now + retry.delay
        # Deterministic: the same run and attempt wait the same.
        assert retry.delay == policy.delay(run.id, attempt)
        assert (settled.status, settled.freed, settled.requeue) == (
            RunStatus(outcome.status),
            True,
            False,
        )
        self.requeues[run.id] = self.requeues.get(run.id, 0) + 1
        key, _ = model.holds[run.id]
        conversation = conversation_key(run)
        if outcome.session and conversation is not None:
            model.last[run.provider, conversation] = key[1]
        model.give_back(run.id, spawned=outcome.spawned, now=now, spent=spent)
        model.held.append(run)
        model.backoff[run.id] = retry.at
        model.attempts[run.id] = attempt
        model.started_before.add(run.id)
        return True

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        model = self.model
        known = sorted(model.seen) or ["nobody"]
        run_id = data.draw(st.sampled_from(known))
        withdrawal = self.life.cancel(run_id)
        if any(r.id == run_id for r in model.queued + model.held):
            assert withdrawal is Withdrawal.WITHDRAWN
            model.queued = [r for r in model.queued if r.id != run_id]
            model.held = [r for r in model.held if r.id != run_id]
            model.started_before.discard(run_id)  # adopted again: as its ledger record says
            model.forget_attempts(run_id)
        elif any(r.id == run_id for r in model.running):
            assert withdrawal is Withdrawal.STOP
            model.stopping.add(run_id)
        else:
            assert withdrawal is Withdrawal.UNKNOWN
        self.take()

    @precondition(lambda self: self.model.running)
    @rule(data=st.data(), hold=st.booleans())
    def refuse(self, data: st.DataObject, hold: bool) -> None:
        """A start not recorded (given back: dropped) or refused elsewhere (held)."""
        model = self.model
        run = self.pick_run(data, model.running)
        model.running.remove(run)
        model.give_back(run.id, spawned=False)
        self.starts[run.id] -= 1  # never started, as far as the ledger knows
        model.stopping.discard(run.id)
        if hold:
            self.life.hold(run.id, self.now)
            model.held.append(run)
        else:
            self.life.give_back(run.id, self.now)
        self.take()

    @precondition(lambda self: self.model.running or self.model.held)
    @rule(data=st.data())
    def lost(self, data: st.DataObject) -> None:
        """Its outcome will never be known: it gives back what it held."""
        model = self.model
        run = self.pick_run(data, model.running + model.held)
        assert self.life.lost(run.id, self.now)
        if run in model.running:
            model.running.remove(run)
            model.give_back(run.id, spawned=True, now=self.now)
        else:
            model.held.remove(run)
        model.stopping.discard(run.id)
        model.started_before.discard(run.id)
        model.forget_attempts(run.id)
        self.take()

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), again=st.booleans(), at_end=st.booleans())
    def adopt(self, data: st.DataObject, again: bool, at_end: bool) -> None:
        """The ledger has a run queued (a poll, a refused cancel): queued here in its place.

        ``at_end``: placed behind every run (a submit recorded as a drain began).
        """
        model = self.model
        run_id = data.draw(st.sampled_from(sorted(self.requests)))
        run, seq = self.requests[run_id]
        here = any(r.id == run_id for r in model.queued + model.running + model.held)
        adopted = self.life.adopt(run, seq=None if at_end else seq, attempts=int(again))
        assert adopted is not here
        if not here:
            if at_end:
                model.order[run_id] = max(model.order.values()) + 1
                new_seq = self.life.scheduler.seq_of(run_id)
                assert new_seq is not None
                self.requests[run_id] = (run, new_seq)
            model.seen.add(run_id)
            model.requeue(run)
            if again:
                model.started_before.add(run_id)
                model.attempts[run_id] = 1
            # A new life as far as this lifecycle knows: the ledger counts its attempts.
            self.starts.pop(run_id, None)
            self.requeues.pop(run_id, None)
        self.take()

    @precondition(lambda self: self.model.seen)
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        """A run left the ledger's queue elsewhere: only a queued one leaves here."""
        model = self.model
        run_id = data.draw(st.sampled_from(sorted(model.seen)))
        queued = any(r.id == run_id for r in model.queued)
        assert self.life.forget(run_id) is queued
        if queued:
            model.queued = [r for r in model.queued if r.id != run_id]
            model.started_before.discard(run_id)
            model.forget_attempts(run_id)
        self.take()

    @precondition(lambda self: self.model.held)
    @rule()
    def requeue_held(self) -> None:
        self.life.requeue_held()
        for run in list(self.model.held):
            if run.id not in self.model.backoff:  # a backoff holds it until it ends
                self.model.held.remove(run)
                self.model.requeue(run)
        self.take()

    @rule(config=settings_st)
    def reload(self, config: Settings) -> None:
        model = self.model
        model.configure(config)
        # Runs already sharing a lane under the new rules (agent exclusivity
        # switched on) keep running: only they may.
        holders = model.running + model.held
        self.shared.update(
            frozenset((a.id, b.id))
            for a in holders
            for b in holders
            if a != b and model.conflicts(a, b)
        )
        self.life.reconfigure(config)
        for account in model.accounts.values():
            account.needs_login = None  # a reload says every account is logged in again
        self.take()

    @rule(
        provider=st.sampled_from(PROVIDERS),
        name=st.sampled_from(("a", "b", "c", None)),
        seconds=st.sampled_from((-1.0, 50.0, 300.0)),
        end=st.booleans(),
    )
    def rest(self, provider: str, name: str | None, seconds: float, end: bool) -> None:
        """A rest set, or ended, by hand (only a configured account's)."""
        model = self.model
        configured = name in model.names(provider)
        if end:
            assert self.life.end_rest(provider, name) is configured
            if configured:
                ended = model.accounts[provider, name]
                ended.resting_until = ended.message = None
                ended.near_until = ended.needs_login = None
        else:
            until = self.now + seconds
            rested = self.life.rest(provider, name, until, "by hand", self.now)
            assert rested is (configured and until > self.now)
            if rested:
                model.accounts[provider, name].resting_until = until
                model.accounts[provider, name].message = "by hand"
        self.take()

    @rule(
        keep=st.sampled_from((None, "out of quota", "reworded")),
        rests=st.lists(ledger_rest_st, max_size=3),
        uses=st.lists(ledger_use_st, max_size=6),
    )
    def sync_accounts(
        self,
        keep: str | None,
        rests: list[tuple[str, str | None, float, str]],
        uses: list[tuple[str, str, float, float | None]],
    ) -> None:
        """A fleet member's poll: the ledger's rests in force, and the other members' runs.

        ``keep``: the ledger still holds the rests in force here, with
        ``rests`` on top: as they are (``"out of quota"``: an unchanged rest
        is no change) or with another message (a change).
        """
        model, now = self.model, self.now
        ledger: dict[tuple[str, str | None], tuple[float, str]] = {}
        if keep is not None:
            for key, account in sorted(model.accounts.items(), key=lambda i: str(i[0])):
                if account.resting_until is not None and account.resting_until > now:
                    assert account.message is not None
                    message = account.message if keep == "out of quota" else keep
                    ledger[key] = (account.resting_until, message)
        for provider, name, seconds, message in rests:
            ledger[provider, name] = (now + seconds, message)
        limits = [(p, n, until, message) for (p, n), (until, message) in ledger.items()]
        others = [
            (p, n, now - ago, None if took is None else now - ago + took)
            for p, n, ago, took in uses
        ]
        changed = self.life.sync_accounts(iter(limits), (AccountUse(*use) for use in others), now)
        assert changed == model.sync_accounts(limits, others, now)
        self.take()

    # Rare, late: nothing starts after it.
    @precondition(lambda self: len(self.model.seen) >= 12)
    @rule()
    def drain(self) -> None:
        self.life.drain()
        self.model.admitting = False
        self.take()

    # -- invariants --------------------------------------------------------

    @invariant()
    def lanes_are_exclusive(self) -> None:
        """No two running or held runs share an exclusion key (nor overlapping directories).

        A reload that switches agent exclusivity on never stops runs already
        sharing an agent: only those pairs may.
        """
        if not hasattr(self, "life"):
            return
        model = self.model
        holders = model.running + model.held
        for a in holders:
            for b in holders:
                if a.id < b.id and model.conflicts(a, b):
                    assert frozenset((a.id, b.id)) in self.shared, f"{a.id} and {b.id} share a lane"

    @invariant()
    def agrees_with_the_model(self) -> None:
        """Queued, running and held runs, in order, and every account's holders."""
        if not hasattr(self, "life"):
            return
        model, scheduler = self.model, self.life.scheduler
        assert [r.id for r in scheduler.queued_runs()] == [r.id for r in model.queued]
        assert sorted(r.id for r in scheduler.running_runs()) == sorted(r.id for r in model.running)
        assert [r.id for r in scheduler.held_runs()] == [r.id for r in model.held]
        for run in model.running:
            assert self.life.book.holding(run.id) == model.holds[run.id][0][1]
            assert self.life.stop_asked(run.id) == (run.id in model.stopping)
        # Every account's usage in its window, the fleet's in a fleet.
        now = self.now
        statuses = self.life.book.statuses(now)
        usage = {(s.provider, s.account): s.usage for s in statuses}
        assert usage == {key: a.usage(now) for key, a in model.accounts.items()}
        marks = {(s.provider, s.account): (s.near_limit_until, s.needs_login) for s in statuses}
        assert marks == {
            key: (a.near_until if a.near(now) else None, a.needs_login)
            for key, a in model.accounts.items()
        }

    @invariant()
    def wakes_when_an_account_frees(self) -> None:
        """The next wake-up is when time alone frees an account a queued run waits for.

        Only a run whose lanes and provider's slot are free waits for an
        account alone: others wait for an event, after which the driver asks again.
        """
        if not hasattr(self, "life"):
            return
        model, now = self.model, self.now
        times = []
        caps = model.settings.limits.provider_caps
        waiting = {
            r.provider
            for r in model.queued
            if sum(o.provider == r.provider for o in model.running) < caps.get(r.provider, 0)
            and not any(model.conflicts(r, o) for o in model.running + model.held)
            and not any(model.conflicts(r, o) for o in model.queued[: model.queued.index(r)])
        }
        for provider in model.settings.accounts:
            accounts = model.configured(provider)
            if provider not in waiting or any(a.available(now) for a in accounts):
                continue
            for account in accounts:
                if account.needs_login is not None:
                    continue  # only a reload or an end of its rest frees it
                concurrency = account.spec.concurrency
                if concurrency is not None and len(account.running) >= concurrency:
                    continue  # only an end of one of its runs frees it
                frees = []
                if account.resting_until is not None and account.resting_until > now:
                    frees.append(account.resting_until)
                spec = account.spec
                window = spec.window
                if spec.budget is not None and window is not None:
                    if spec.unit == "runs":
                        inside = account.in_window(now)
                    else:  # what ended leaves the window first
                        inside = [end for end, _, _ in account.ends_in_window(now)]
                    if inside and account.usage(now) >= spec.budget:
                        frees.append(min(inside) + window)
                if frees:
                    times.append(max(frees))
        times.extend(model.backoff.values())
        assert self.life.next_wakeup(now) == (min(times) if times else None)


TestLifecycle = LifecycleMachine.TestCase
TestLifecycle.settings = settings(max_examples=200, stateful_step_count=80, deadline=None)


def test_a_usage_limit_requeues_a_run_once_then_it_fails_for_good() -> None:
    # The rule the machine checks, in one plain example.
    life = Lifecycle(Settings(Limits({"p": 1}), accounts={"p": (AccountSpec("a"),)}))
    run = RunRequest("r", "p", "c")
    assert life.submit(run, 0.0) is Admission.QUEUED
    limited = RunOutcome(Outcome.FAILED, 1, UsageLimit(50.0, "out of quota"))
    assert list(life.take_starts(0.0)) == ["r"]
    first = life.finish("r", limited, 10.0)
    assert (first.status, first.requeue, first.freed) == (RunStatus.USAGE_LIMITED, True, False)
    life.settle("r", 10.0, requeued=True)
    assert life.next_wakeup(10.0) == 50.0
    assert not life.take_starts(20.0)  # its account rests
    assert list(life.take_starts(50.0)) == ["r"]
    second = life.finish("r", limited, 60.0)
    assert (second.status, second.requeue) == (RunStatus.USAGE_LIMITED, False)
    life.settle("r", 60.0, requeued=False)
    assert life.queued_count == life.running_count == 0


@pytest.mark.parametrize("status", [Outcome.SUCCEEDED, Outcome.CANCELLED])
def test_a_plain_finish_is_one_shared_settlement(status: Outcome) -> None:
    life = Lifecycle(Settings(Limits({"p": 2}), accounts={"p": ()}))
    for run_id in ("a", "b"):
        life.submit(RunRequest(run_id, "p"), 0.0)
    life.take_starts(0.0)
    first = life.finish("a", RunOutcome(status, 0), 1.0)
    assert life.finish("b", RunOutcome(status, 0), 1.0) is first
    assert (first.status, first.freed, first.rest) == (RunStatus(status), True, None)
