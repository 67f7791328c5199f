"""The sans-IO run lifecycle: every rule of a run's life, as events in and effects out.

Why this module is long: it is the one home of every rule of a run's life
(the point of the module), and the rules read best together, each event
beside the ones it interacts with; the fast engine calls it per event, so
its handlers stay in one class without a layer of indirection.

One :class:`Lifecycle` owns the :class:`~herdsman.core.Scheduler` and the
:class:`~herdsman.core.accounts.AccountBook` and decides, for each event a
driver hands it with the time it happened, what becomes of the runs:

* **submit** — a known id is the run it already was; ``on_busy = "skip"``
  skips a run whose conversation or agent has a queued or running run; a
  draining lifecycle admits nothing (:class:`Admission`);
* **take starts** — every run that may start now, in start order, each with
  the account it spends (slots, lanes, FIFO per key, the account gate,
  pins and stickiness): a mapping of run id to
  :class:`~herdsman.core.accounts.Pick`;
* **give back** a start the driver could not record durably (as if never
  taken), or **hold** one refused elsewhere (a fleet claim: it keeps its
  lanes, gives back its slot and account) and **requeue the held** later;
* **finish** with a :class:`~herdsman.core.outcome.RunOutcome` — the status
  the ledger records, whether a usage limit rests the account and re-queues
  the run (once: only its first attempt), whether a failure to authenticate
  marks the account as needing a login and moves the run to another account
  (re-queued the same way), what the run spent for its account's budget, a
  provider's warning that the account is near its limit, and the slot, lanes
  and account given back (:class:`Settlement`); a re-queue (and a limit's
  rest) take effect at :meth:`Lifecycle.settle`, once the driver has made
  the finish durable;
* **cancel** a queued or held run (withdrawn) or a running one (stop it;
  its finish follows, never re-queued); **lost** (a restart, a lease that
  ended, a finish that could not be recorded): its slot, lanes and account
  given back;
* **adopt** a run the ledger has queued (a fleet member's poll, a run whose
  cancel the ledger refused) in its place by its sequence number, or
  **forget** a queued one that left the ledger's queue elsewhere;
* **reconfigure** (a reload): caps, agent exclusivity, accounts added and
  removed, an account that comes back getting its rest and usage back;
* **retry** an attempt that failed for a transient reason its provider's
  :class:`~herdsman.core.retry.RetryPolicy` retries: the run is held (its
  lanes kept, its slot and account given back) until its backoff ends, then
  goes back to the head of its lanes at the first :meth:`Lifecycle.take_starts`
  after that (:class:`Retry`);
* **rests** reported, restored or ended by hand, and :meth:`Lifecycle.next_wakeup`,
  when time alone frees an account a queued run waits for, or a backoff ends.

No trio, no I/O, no clock (every event carries its ``now``, unix seconds),
no randomness: the production supervisor's dispatch and the fast simulation
engine make the very same decisions through it. Effects are plain frozen
values; an engine asks for some with nearly every run, so none is made
where one already exists: the starts are the account gate's own picks, and
a plain finish's settlement is made once per status and shared.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

import attrs

from herdsman.core.accounts import (
    NO_CHARGE,
    AccountBook,
    AccountGate,
    AccountSpec,
    AccountUse,
    Charge,
    Pick,
    sticky_key,
)
from herdsman.core.outcome import AccountSignals, Outcome, RunOutcome, RunStatus
from herdsman.core.retry import NO_RETRIES, Failure, RetryPolicy
from herdsman.core.runs import RunRequest
from herdsman.core.scheduler import CancelOutcome, Limits, RunState, Scheduler, StartGate

__all__ = [
    "Admission",
    "Lifecycle",
    "LoginNeeded",
    "Rest",
    "Retry",
    "Settings",
    "Settlement",
    "Use",
    "Withdrawal",
    "apply_settings",
    "returning_accounts",
]


def _copy_accounts(
    accounts: Mapping[str, Sequence[AccountSpec]],
) -> Mapping[str, tuple[AccountSpec, ...]]:
    return {provider: tuple(specs) for provider, specs in accounts.items()}


@attrs.frozen
class Settings:
    """What a configuration says about the rules: caps, exclusivity, accounts, checkouts.

    ``accounts`` lists every provider's accounts in config order (an empty
    list: the ambient one); ``checkouts``: conversations get worktrees of
    configured repositories, made before a run's process is spawned;
    ``retries``: each provider's retry policy (a provider not named retries
    nothing).
    """

    limits: Limits
    agent_exclusive: bool = False
    accounts: Mapping[str, tuple[AccountSpec, ...]] = attrs.field(
        factory=dict, converter=_copy_accounts
    )
    checkouts: bool = False
    retries: Mapping[str, RetryPolicy] = attrs.field(factory=dict)


class Admission(enum.Enum):
    """What :meth:`Lifecycle.submit` did with a run."""

    #: Queued behind everything submitted before it.
    QUEUED = "queued"
    #: Recorded as skipped: ``on_busy = "skip"`` and its conversation or agent was busy.
    SKIPPED = "skipped"
    #: Its id was submitted before: the run it already was, nothing changed.
    KNOWN = "known"
    #: The lifecycle is draining and admits no run.
    REFUSED = "refused"


# Members read in every submit and finish, bound once: reading a member
# through its enum class costs five times a module global (EnumType's
# attribute lookup), about a tenth of the fast engine's cost of a run.
_QUEUED, _SKIPPED, _KNOWN = Admission.QUEUED, Admission.SKIPPED, Admission.KNOWN
_SUCCEEDED = Outcome.SUCCEEDED


class Withdrawal(enum.Enum):
    """What :meth:`Lifecycle.cancel` decided."""

    #: It was queued or held: it is gone, and never starts; record the cancel.
    WITHDRAWN = "withdrawn"
    #: It runs: stop its process. Its finish follows, and it is never re-queued.
    STOP = "stop"
    #: No queued, held or running run has this id.
    UNKNOWN = "unknown"


@attrs.frozen
class Rest:
    """An account out of quota rests until ``until`` (unix seconds)."""

    provider: str
    account: str | None
    until: float
    message: str

    @property
    def label(self) -> str:
        """The account as a log line names it."""
        return "the ambient account" if self.account is None else f"account {self.account}"


@attrs.frozen
class Retry:
    """A failed attempt tried again: attempt number ``attempt`` (from 1) failed with ``failure``.

    The run waits until ``at`` (unix seconds), ``delay`` seconds after its
    failure, holding its lanes; then it heads them again.
    """

    attempt: int
    failure: Failure
    at: float
    delay: float


@attrs.frozen
class LoginNeeded:
    """A run failed to authenticate on an account: it takes no run until a reload or end-rest."""

    provider: str
    account: str | None
    message: str

    @property
    def label(self) -> str:
        """The account as a log line names it."""
        return "the ambient account" if self.account is None else f"account {self.account}"


@attrs.frozen
class Settlement:
    """How a finish settles a run: what to record, and what follows.

    ``retry``: the attempt failed and is tried again (the driver records
    the attempt and re-queues the run in the ledger with the finish); its
    slot and account are given back now, its lanes kept until then.
    ``freed``: the run's slot, lanes and account are given back already; if
    not (a usage limit or a needed login to act on), they are once the
    driver has recorded the finish and calls :meth:`Lifecycle.settle`, which
    then rests the account (``rest``) and puts the run back at the head of
    its lanes (``requeue``). ``login``: the account needs a login from now
    on (marked at the finish already: nothing of it is recorded). A run
    that moves for a login is recorded ``usage_limited`` and re-queued, as
    one that met a usage limit is.
    """

    status: RunStatus
    spawned: bool
    requeue: bool = False
    rest: Rest | None = None
    freed: bool = True
    retry: Retry | None = None
    login: LoginNeeded | None = None


class _Pending:
    """A finish whose re-queue (or usage limit) takes effect at :meth:`Lifecycle.settle`."""

    __slots__ = ("charge", "rest", "spawned", "sticks")

    def __init__(
        self, rest: Rest | None, spawned: bool, sticks: tuple[str, str] | None, charge: Charge
    ) -> None:
        self.rest = rest
        self.spawned = spawned
        # (provider, conversation key) that sticks to the account, if a session was reported.
        self.sticks = sticks
        # What the attempt spent, charged if it is not re-queued.
        self.charge = charge


_NO_STARTS: Mapping[str, Pick] = MappingProxyType({})

#: A run of an earlier process charged to an account: provider, account,
#: started, finished (None: running), and optionally the tokens and dollars
#: it spent (None: not stated).
Use = (
    tuple[str, str | None, float, float | None]
    | tuple[str, str | None, float, float | None, int | None, float | None]
)


def returning_accounts(
    book: AccountBook, accounts: Mapping[str, Sequence[AccountSpec]]
) -> set[tuple[str, str | None]]:
    """Accounts of ``accounts`` that ``book`` has not configured now (membership only)."""
    wanted: set[tuple[str, str | None]] = set()
    for provider, specs in accounts.items():
        names: list[str | None] = [spec.name for spec in specs] or [None]
        wanted.update((provider, name) for name in names)
    return {pair for pair in wanted if not book.knows(*pair)}


def apply_settings(scheduler: Scheduler, book: AccountBook, old: Settings, new: Settings) -> None:
    """Put ``new``'s caps, exclusivity and accounts in force in the cores (a reload).

    Running runs keep their slots and accounts; providers gone from ``new``
    keep their running runs' accounts until those end.
    """
    scheduler.set_limits(new.limits)
    scheduler.set_agent_exclusive(new.agent_exclusive)
    for provider, specs in new.accounts.items():
        book.configure(provider, specs)
    for provider in old.accounts:
        if provider not in new.accounts:
            book.remove_provider(provider)


class Lifecycle:
    """Every rule of a run's life: events (each with its ``now``) in, effects out.

    The scheduler and the account book are its own; :attr:`scheduler` and
    :attr:`book` are there to be read (status views, and a driver's cheap
    tests such as ``scheduler.queued_count``), never changed from outside.
    :attr:`admitting` is false once :meth:`drain` was called.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.scheduler = Scheduler(settings.limits, agent_exclusive=settings.agent_exclusive)
        self.book = AccountBook(settings.accounts)
        self.admitting = True
        # Every id submitted (membership only): a repeated submit is the run it was.
        self._seen: set[str] = set()
        # Runs started before this attempt (re-queued after a usage limit, or
        # carried over with attempts): a usage limit never re-queues them again.
        self._again: set[str] = set()
        # Running runs a cancel asked to stop: never re-queued.
        self._stopping: set[str] = set()
        self._pending: dict[str, _Pending] = {}
        # Starts made before the current attempt, for runs with any (a retry
        # counts attempts by them); absent: none.
        self._starts: dict[str, int] = {}
        # Runs held until their backoff ends (unix seconds).
        self._backoff: dict[str, float] = {}
        # One settlement per (status, spawned) for plain finishes, made once.
        self._plain: dict[tuple[Outcome, bool], Settlement] = {}

    # -- queries -----------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings in force."""
        return self._settings

    @property
    def queued_count(self) -> int:
        """Runs waiting to start."""
        return self.scheduler.queued_count

    @property
    def running_count(self) -> int:
        """Runs running (held ones are not)."""
        return self.scheduler.running_count

    def has_free_slot(self, provider: str) -> bool:
        """Whether ``provider`` and the global cap have a slot free (lanes and accounts aside)."""
        return self.scheduler.has_free_slot(provider)

    def is_busy(self, run: RunRequest) -> bool:
        """Whether a queued or running run shares ``run``'s conversation or agent."""
        return self.scheduler.is_busy(run)

    @property
    def waiting(self) -> bool:
        """Whether any run waits to start: queued, or held until its backoff ends."""
        return bool(self.scheduler.queued_count or self._backoff)

    @property
    def may_wake_in_time(self) -> bool:
        """Whether time alone may let a run start: a backoff ends, or an account frees for one.

        False: :meth:`next_wakeup` is None, so a driver need not read the time.
        """
        return bool(self._backoff) or bool(self.book.may_free_in_time and self.scheduler.startable)

    def backoff_of(self, run_id: str) -> float | None:
        """When ``run_id``'s backoff ends (unix seconds), if it waits out one."""
        return self._backoff.get(run_id)

    def started_before(self, run_id: str) -> bool:
        """Whether ``run_id`` started before this attempt: a usage limit no longer re-queues it."""
        return run_id in self._again

    def next_wakeup(self, now: float) -> float | None:
        """When time alone frees an account a queued run waits for (unix seconds), if ever.

        Only providers in the scheduler's ready index (a run free to start on
        its lanes, a slot free) with no account available now count: the
        earliest moment one of their accounts' rest ends or usage leaves its
        window. A provider whose runs wait on a lane or a slot is left out:
        only an event (a finish, a cancel, a reload) frees those, and the
        driver asks again after it. The end of a backoff counts too. None:
        only an event can let a run start.
        """
        book = self.book
        soonest: float | None = min(self._backoff.values()) if self._backoff else None
        startable = self.scheduler.startable
        if not (book.may_free_in_time and startable):
            return soonest  # nothing may start, or time alone frees no account
        for provider in startable:  # a minimum: the order does not matter
            # A provider the book knows closed answers from memory (closed).
            at = book.blocked_until(provider, now)  # None: available now
            if at is not None and at != math.inf and (soonest is None or at < soonest):
                soonest = at
        return soonest

    # -- submit ------------------------------------------------------------

    def submit(
        self,
        run: RunRequest,
        now: float,
        skip: bool = False,
        *,
        seq: int | None = None,
        attempts: int = 0,
        claimed: bool = False,
    ) -> Admission:
        """A run was asked for at ``now``: queue it, skip it, or say it is known.

        ``skip``: ``on_busy = "skip"``. ``seq``: its place in the queue (a
        fleet's ledger order, see :meth:`Scheduler.submit`). ``attempts``:
        starts an earlier process made of it (a run carried over a restart),
        so a usage limit re-queues it only if it never started. ``claimed``:
        one of its keys is held by a submit not yet queued (one waiting for
        a removal of its conversation's worktrees), so it counts as busy.
        """
        if not self.admitting:
            return Admission.REFUSED
        seen = self._seen
        if run.id in seen:
            return _KNOWN
        seen.add(run.id)
        if skip and (claimed or self.scheduler.is_busy(run)):
            return _SKIPPED
        self.scheduler.submit(run, seq=seq)
        if attempts:
            self._again.add(run.id)
            self._starts[run.id] = attempts
        return _QUEUED

    def adopt(self, run: RunRequest, *, seq: int | None = None, attempts: int = 0) -> bool:
        """The ledger has ``run`` queued: queue it here too, in its place by ``seq``.

        For a fleet member's poll (the fleet's order), for a run a cancel
        withdrew whose cancel the ledger then refused (back in its place,
        ahead of the runs that came after it), and for a submit the ledger
        recorded while a drain began (``seq`` None: behind every run). Unlike
        :meth:`submit`, an id seen before is queued again, and a draining
        lifecycle takes it too (nothing starts while it drains). A run
        queued, running or held here is left as it is; returns whether
        ``run`` was queued. ``attempts`` as for :meth:`submit`.
        """
        if self.scheduler.state_of(run.id) is not None:
            return False
        self._seen.add(run.id)
        self.scheduler.submit(run, seq=seq)
        if attempts:
            self._again.add(run.id)
            self._starts[run.id] = attempts
        return True

    def forget(self, run_id: str) -> bool:
        """A queued run left the ledger's queue elsewhere (another member took it, or it ended).

        It leaves the queue here, and nothing of it is to be recorded; only a
        queued run does (a run taken for a start here is settled by its
        start). Returns whether it left. :meth:`adopt` queues it again.
        """
        if self.scheduler.state_of(run_id) is not RunState.QUEUED:
            return False
        self.scheduler.cancel(run_id)
        self._again.discard(run_id)
        self._starts.pop(run_id, None)
        return True

    def pin(self, run_id: str, account: str | None) -> None:
        """Start ``run_id`` on ``account`` if it can take the run then (``AccountBook.pin``)."""
        self.book.pin(run_id, account)

    # -- starts ------------------------------------------------------------

    def take_starts(
        self, now: float, *, gate: Callable[[AccountGate], StartGate] | None = None
    ) -> Mapping[str, Pick]:
        """Every run that may start at ``now``: run ids in start order, each with its account.

        Every run named is running from now on: the driver records its start
        (durably, before its process is spawned) or gives it back
        (:meth:`give_back`). ``gate`` wraps the account gate in a further
        condition (a fleet member's caps); it must hand every start on to
        the account gate.
        """
        scheduler = self.scheduler
        if self._backoff and self.admitting:
            self._end_backoffs(now)
        startable = scheduler.startable
        if not (self.admitting and startable):
            return _NO_STARTS  # every queued run waits on a lane or a slot
        closed = self.book.closed
        if closed:
            # Every ready provider's accounts closed at ``now`` (the book's
            # account-side signal): no gate to make, no provider to ask.
            for provider in startable:
                known = closed.get(provider)
                if known is None or not known[0] <= now < known[1]:
                    break
            else:
                return _NO_STARTS
        accounts = AccountGate(self.book, now)
        scheduler.take_startable(accounts if gate is None else gate(accounts))
        return accounts.picks

    def needs_worktree(self, run: RunRequest) -> bool:
        """Whether ``run``'s conversation gets its checkouts before its process is spawned."""
        return self._settings.checkouts and run.conversation is not None

    def give_back(self, run_id: str, now: float) -> None:
        """A start the driver could not record, or that another took: the run leaves.

        Its slot and lanes are freed and its account's budget gets the start
        back, as if it never started; it is no longer queued here either (the
        ledger still has it queued, and a restart or a poll queues it again).
        """
        self.scheduler.finish(run_id)
        self.book.finish(run_id, now, spawned=False)
        self._stopping.discard(run_id)

    def hold(self, run_id: str, now: float) -> None:
        """A start refused elsewhere for now (a fleet claim): it keeps its lanes only.

        Its slot and its account's start are given back;
        :meth:`requeue_held` puts it back in its place, :meth:`cancel`
        withdraws it.
        """
        self.book.finish(run_id, now, spawned=False)
        self.scheduler.hold(run_id)
        self._stopping.discard(run_id)

    def requeue_held(self) -> None:
        """Every held run goes back to its place in the queue, but those waiting out a backoff."""
        scheduler, backoff = self.scheduler, self._backoff
        for run in list(scheduler.held_runs()):
            if run.id not in backoff:
                scheduler.requeue(run.id)

    def _end_backoffs(self, now: float) -> None:
        """Runs whose backoff ended by ``now`` go back to their place at the head of their lanes."""
        backoff = self._backoff
        # Sorted, so the order never depends on the order the runs failed in.
        for run_id in sorted(run_id for run_id, at in backoff.items() if at <= now):
            del backoff[run_id]
            self.scheduler.requeue(run_id)

    # -- finish ------------------------------------------------------------

    def finish(self, run_id: str, outcome: RunOutcome, now: float) -> Settlement:
        """A running run's attempt ended at ``now``: settle it.

        A usage limit reported by a run that did not succeed rests its
        account (until the reported reset, else its window, else an hour);
        a plain failure then counts as ``usage_limited``, and a run at its
        first attempt that nobody asked to stop goes back to the head of its
        lanes. A run that did not succeed because it failed to authenticate
        marks its account as needing a login at once, and moves the same
        way. Without a re-queue or a limit to act on, the slot, lanes and
        account are given back now (a run never spawned gives its start back
        to the budget); with one, at :meth:`settle`. A provider's warning
        that the account is near its limit marks it so now, whatever the
        status.
        """
        signals = outcome.account
        if signals is not None and (signals.near_limit or signals.needs_login is not None):
            moved = self._account_signals(run_id, outcome, signals, now)
            if moved is not None:
                return moved
        if outcome.usage_limit is not None and outcome.status is not _SUCCEEDED:
            limited = self._limit_hit(run_id, outcome, now)
            if limited is not None:
                return limited
        else:
            if outcome.failure is not None and outcome.status is not _SUCCEEDED:
                retried = self._retry(run_id, outcome, outcome.failure, now)
                if retried is not None:
                    return retried
            if self._stopping:
                self._stopping.discard(run_id)
        if outcome.session:
            self._stick(run_id)
        spawned = outcome.exit_code is not None
        self.scheduler.finish(run_id)
        self.book.finish(run_id, now, spawned=spawned, charge=outcome.charge)
        if self._again:
            self._again.discard(run_id)
            self._starts.pop(run_id, None)
        plain = self._plain.get((outcome.status, spawned))
        if plain is None:
            plain = self._plain[outcome.status, spawned] = Settlement(
                RunStatus(outcome.status), spawned
            )
        return plain

    def _retry(
        self, run_id: str, outcome: RunOutcome, failure: Failure, now: float
    ) -> Settlement | None:
        """:meth:`finish` of a failed attempt its provider's policy tries again; None if not.

        Never a run a cancel asked to stop, nor one whose provider left the
        configuration.
        """
        if run_id in self._stopping:
            return None
        request = self.scheduler.request_of(run_id)
        if request is None:
            raise ValueError(f"run {run_id!r} is not running")
        policy = self._settings.retries.get(request.provider, NO_RETRIES)
        attempt = self._starts.get(run_id, 0) + 1
        if not policy.retries(failure, attempt, worked=outcome.worked):
            return None
        delay = policy.delay(run_id, attempt)
        if outcome.session:
            self._stick(run_id)
        # Its account spent the attempt; its lanes stay held, so no later
        # run of its conversation or agent starts before it.
        self.book.finish(run_id, now, spawned=outcome.spawned, charge=outcome.charge)
        self.scheduler.hold(run_id)
        self._backoff[run_id] = now + delay
        self._starts[run_id] = attempt
        self._again.add(run_id)
        retry = Retry(attempt, failure, now + delay, delay)
        return Settlement(RunStatus(outcome.status), outcome.spawned, retry=retry)

    def _account_signals(
        self, run_id: str, outcome: RunOutcome, signals: AccountSignals, now: float
    ) -> Settlement | None:
        """Mark the run's account near its limit, or needing a login; the move, if it moves.

        None: the finish goes on as any other (a usage limit, if one came,
        decides the rest).
        """
        request = self.scheduler.request_of(run_id)
        if request is None:
            raise ValueError(f"run {run_id!r} is not running")
        book, provider = self.book, request.provider
        account = book.holding(run_id)
        if not book.knows(provider, account):
            return None  # the account left the configuration: nothing to mark
        if signals.near_limit:
            # As a rest: the warning's reset if it is believable, else the window.
            until = book.rest_until(provider, account, now, signals.near_limit_until)
            if until is not None:
                book.warn(provider, account, until)
        message = signals.needs_login
        if message is None or outcome.status is _SUCCEEDED or outcome.usage_limit is not None:
            return None
        book.need_login(provider, account, message)
        login = LoginNeeded(provider, account, message)
        stopped = run_id in self._stopping
        self._stopping.discard(run_id)
        spawned = outcome.spawned
        if run_id in self._again or stopped:
            # Moved once already, or asked to stop: it ends here, as it ended.
            if outcome.session:
                self._stick(run_id)
            self.scheduler.finish(run_id)
            book.finish(run_id, now, spawned=spawned, charge=outcome.charge)
            self._again.discard(run_id)
            self._starts.pop(run_id, None)
            return Settlement(RunStatus(outcome.status), spawned, login=login)
        sticks = None
        if outcome.session and request.conversation is not None:
            sticks = (provider, sticky_key(request.workspace, request.conversation))
        self._pending[run_id] = _Pending(None, spawned, sticks, outcome.charge)
        return Settlement(RunStatus.USAGE_LIMITED, spawned, requeue=True, freed=False, login=login)

    def _limit_hit(self, run_id: str, outcome: RunOutcome, now: float) -> Settlement | None:
        """:meth:`finish` of a run that reported a usage limit; None if its account is gone."""
        stopped = run_id in self._stopping
        self._stopping.discard(run_id)
        request = self.scheduler.request_of(run_id)
        if request is None:
            raise ValueError(f"run {run_id!r} is not running")
        assert outcome.usage_limit is not None
        provider, account = request.provider, self.book.holding(run_id)
        until = self.book.rest_until(provider, account, now, outcome.usage_limit.resets_at)
        if until is None:  # the account left the configuration: a plain end
            return None
        status = outcome.status
        final = RunStatus.USAGE_LIMITED if status is Outcome.FAILED else RunStatus(status)
        requeue = final is RunStatus.USAGE_LIMITED and run_id not in self._again and not stopped
        rest = Rest(provider, account, until, outcome.usage_limit.message)
        sticks = None
        if outcome.session and request.conversation is not None:
            sticks = (provider, sticky_key(request.workspace, request.conversation))
        self._pending[run_id] = _Pending(rest, outcome.spawned, sticks, outcome.charge)
        return Settlement(final, outcome.spawned, requeue=requeue, rest=rest, freed=False)

    def settle(self, run_id: str, now: float, *, requeued: bool) -> None:
        """A finish that hit a usage limit (or needs a login) is recorded: free or re-queue the run.

        A usage limit rests the run's account now.

        ``requeued``: what the ledger did (it may have cancelled a run the
        settlement re-queued, if a cancel was asked elsewhere meanwhile).
        """
        pending = self._pending.pop(run_id)
        # A stop asked once the finish was in never outlives its attempt.
        self._stopping.discard(run_id)
        account = self.book.holding(run_id)
        if requeued:
            self.scheduler.requeue(run_id)
            # Its account gets the attempt back as a run that ended now; what
            # it spent is not charged, as the ledger keeps no spend of it.
            self.book.finish(run_id, now)
            self._again.add(run_id)
            self._starts[run_id] = self._starts.get(run_id, 0) + 1
        else:
            self.scheduler.finish(run_id)
            self.book.finish(run_id, now, spawned=pending.spawned, charge=pending.charge)
            self._again.discard(run_id)
            self._starts.pop(run_id, None)
        rest = pending.rest
        if rest is not None:
            self.book.rest(rest.provider, rest.account, rest.until, rest.message)
        if pending.sticks is not None:
            self.book.remember(*pending.sticks, account)

    def _stick(self, run_id: str) -> None:
        """The run's session lives under its account: its conversation sticks to it."""
        request = self.scheduler.request_of(run_id)
        if request is not None and request.conversation is not None:
            key = sticky_key(request.workspace, request.conversation)
            self.book.remember(request.provider, key, self.book.holding(run_id))

    # -- cancel, lost, drain ------------------------------------------------

    def cancel(self, run_id: str) -> Withdrawal:
        """Withdraw a queued or held run, or ask a running one to stop."""
        withdrawn = self.scheduler.cancel(run_id)
        if withdrawn is CancelOutcome.REMOVED:
            self._again.discard(run_id)
            self._starts.pop(run_id, None)
            # Withdrawn while it waited out a backoff: the backoff ends with it.
            self._backoff.pop(run_id, None)
            # Asked to stop as it ran, then re-queued: the stop was its attempt's.
            self._stopping.discard(run_id)
            return Withdrawal.WITHDRAWN
        if withdrawn is CancelOutcome.RUNNING:
            self._stopping.add(run_id)
            return Withdrawal.STOP
        return Withdrawal.UNKNOWN

    def stop_asked(self, run_id: str) -> bool:
        """Whether a cancel asked ``run_id`` to stop as it ran, and its end is not settled yet."""
        return run_id in self._stopping

    def lost(self, run_id: str, now: float) -> bool:
        """The run's outcome will never be known (a restart, a lease that ended).

        Also a finish the driver could not record: a usage limit's rest and
        re-queue it called for (:meth:`settle`) never happen. A run running
        or held here gives back its slot, lanes and account; returns whether
        it was.
        """
        scheduler = self.scheduler
        self._stopping.discard(run_id)
        self._again.discard(run_id)
        self._pending.pop(run_id, None)
        self._starts.pop(run_id, None)
        self._backoff.pop(run_id, None)
        state = scheduler.state_of(run_id)
        if state is None:
            return False
        if scheduler.cancel(run_id) is CancelOutcome.RUNNING:
            scheduler.finish(run_id)
        self.book.finish(run_id, now)
        return True

    def drain(self) -> None:
        """Stop admitting runs and starting them (a shutdown); running runs go on."""
        self.admitting = False

    # -- accounts ----------------------------------------------------------

    def may_rest(self, provider: str, account: str | None, until: float, now: float) -> bool:
        """Whether :meth:`rest` would rest the account: configured, and ``until`` still ahead."""
        return math.isfinite(until) and until > now and self.book.knows(provider, account)

    def rest(
        self, provider: str, account: str | None, until: float, message: str, now: float
    ) -> bool:
        """Rest a configured account until ``until``, a time still ahead; whether it does."""
        if not self.may_rest(provider, account, until, now):
            return False
        self.book.rest(provider, account, until, message)
        return True

    def sync_accounts(
        self,
        rests: Iterable[tuple[str, str | None, float, str]],
        elsewhere: Iterable[AccountUse],
        now: float,
    ) -> list[tuple[str, str | None, float | None]]:
        """The fleet's word on the accounts (a poll): exactly its rests, and others' usage.

        ``rests`` replace every rest in force (``AccountBook.sync_rests``);
        ``elsewhere``, the runs other members charged to accounts, replaces
        the last such snapshot (``AccountBook.set_elsewhere``). Returns the
        rests that changed: (provider, account, until), ``until`` None for
        a rest that ended.
        """
        self.book.set_elsewhere(elsewhere)
        return self.book.sync_rests(rests, now)

    def charge(self, provider: str, account: str | None, now: float, charge: Charge) -> None:
        """What a run that ended at ``now`` spent, known only once its finish was recorded.

        For a stream that reports a session's running totals: the run's own
        share is worked out from the session's earlier runs, which only the
        ledger knows. Counted as though the run had stated it at its finish.
        """
        self.book.charge(provider, account, now, charge)

    def logged_in(self) -> list[tuple[str, str | None]]:
        """A reload: every account that needed a login may take runs again; which did.

        A reload is how an operator says the accounts are logged in again,
        whether or not the file changed.
        """
        return self.book.logged_in()

    def end_rest(self, provider: str, account: str | None) -> bool:
        """End a configured account's rest now (by hand); False if it is not configured."""
        if not self.book.knows(provider, account):
            return False
        self.book.wake(provider, account)
        return True

    def remember(
        self, provider: str, workspace: str, conversation: str, account: str | None
    ) -> None:
        """The account ``conversation``'s session lives under (an earlier process's)."""
        self.book.remember(provider, sticky_key(workspace, conversation), account)

    def restore(
        self,
        rests: Iterable[tuple[str, str | None, float, str]] = (),
        uses: Iterable[Use] = (),
        *,
        only: set[tuple[str, str | None]] | None = None,
    ) -> None:
        """Rests in force and window usage an earlier process left (``only`` these accounts).

        A use is ``(provider, account, started, finished)``, and what the run
        spent (tokens, dollars) where a budget counts it.
        """
        book = self.book
        for provider, account, until, message in rests:
            if only is None or (provider, account) in only:
                book.rest(provider, account, until, message)
        for use in uses:
            provider, account, started, finished = use[:4]
            if only is None or (provider, account) in only:
                charge = NO_CHARGE if len(use) == 4 else Charge(*use[4:])
                book.restore_usage(provider, account, started, finished, charge)

    # -- reload ------------------------------------------------------------

    def returning(self, settings: Settings) -> set[tuple[str, str | None]]:
        """Accounts ``settings`` has that are not configured now: a reload brings them back."""
        return returning_accounts(self.book, settings.accounts)

    def reconfigure(
        self,
        settings: Settings,
        rests: Iterable[tuple[str, str | None, float, str]] = (),
        uses: Iterable[Use] = (),
    ) -> None:
        """A reload: put ``settings`` in force, all at once.

        Running runs keep their slots and accounts; lowering a cap only
        delays new starts. An account that comes back (removed, then added
        again) gets its rest and window usage back from ``rests`` and
        ``uses`` (the ledger's, as at a restart); others' are ignored.
        """
        returning = self.returning(settings)
        old, self._settings = self._settings, settings
        apply_settings(self.scheduler, self.book, old, settings)
        self.logged_in()
        if returning:
            self.restore(rests, uses, only=returning)
