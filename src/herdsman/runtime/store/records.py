"""Run records, their statuses and the legal transitions between them.

Everything here is shared by every store implementation, so the rules (which
transition is legal, how a record changes, how metadata is normalised) exist
exactly once and the implementations cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, TypeAlias

import attrs

# Defined in the core, where the lifecycle decides with it; re-exported here.
# One record of a use of an account, shared with the account core that counts it.
from herdsman.core.account_usage import AccountUse as AccountUse  # noqa: PLC0414
from herdsman.core.outcome import RunStatus as RunStatus  # noqa: PLC0414
from herdsman.core.runs import DEFAULT_WORKSPACE
from herdsman.runtime.runner.run_usage import RunUsage, Tokens

# Moved out; re-exported here, where every store imports them from.
from herdsman.runtime.store.checks import all_plain
from herdsman.runtime.store.checks import check_limit as check_limit  # noqa: PLC0414
from herdsman.runtime.store.checks import check_limit_text as check_limit_text  # noqa: PLC0414
from herdsman.runtime.store.checks import check_now as check_now  # noqa: PLC0414
from herdsman.runtime.store.checks import check_text as check_text  # noqa: PLC0414
from herdsman.runtime.store.checks import check_texts as check_texts  # noqa: PLC0414
from herdsman.runtime.store.checks import normalise_metadata as normalise_metadata  # noqa: PLC0414
from herdsman.runtime.store.errors import RunNotFound, StoreConflict, StoreError
from herdsman.runtime.store.spend import Spend as Spend  # noqa: PLC0414
from herdsman.runtime.store.spend import budget_charge as budget_charge  # noqa: PLC0414
from herdsman.runtime.store.spend import own_spend as own_spend  # noqa: PLC0414
from herdsman.runtime.store.spend import spend_json as spend_json  # noqa: PLC0414
from herdsman.runtime.store.spend import spend_of as spend_of  # noqa: PLC0414
from herdsman.runtime.store.spend import tokens_json as tokens_json  # noqa: PLC0414

JSON: TypeAlias = bool | int | float | str | list["JSON"] | dict[str, "JSON"] | None

LOST_ON_RESTART = "supervisor restarted before this run finished"
"""The ``reason`` every run found ``running`` by :meth:`Store.recover` gets."""


TERMINAL_STATUSES: frozenset[RunStatus] = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.TIMED_OUT,
        RunStatus.CANCELLED,
        RunStatus.LOST,
        RunStatus.SKIPPED,
        RunStatus.USAGE_LIMITED,
    }
)
"""Final outcomes: waiters stop waiting on them and :meth:`Store.prune` may delete them.

``usage_limited`` is one although the lifecycle still allows
``usage_limited → queued``: the supervisor re-queues a usage-limited run only
in the same :meth:`Store.apply` batch that records it, so the two commit
together and a ``usage_limited`` run that stays was not re-queued, for good.
"""

LEGAL_TRANSITIONS: Mapping[RunStatus, frozenset[RunStatus]] = {
    # First, so the entries below override it: usage_limited is terminal yet
    # keeps its one way out.
    **{status: frozenset() for status in TERMINAL_STATUSES},
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.SKIPPED}),
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.SUCCEEDED,
            RunStatus.FAILED,
            RunStatus.TIMED_OUT,
            RunStatus.CANCELLED,
            RunStatus.LOST,
            RunStatus.USAGE_LIMITED,
        }
    ),
    RunStatus.USAGE_LIMITED: frozenset({RunStatus.QUEUED}),
    # A failed attempt its provider's retry policy tries again (docs/operations.md, "Retries").
    RunStatus.FAILED: frozenset({RunStatus.QUEUED}),
    RunStatus.TIMED_OUT: frozenset({RunStatus.QUEUED}),
}
"""From each status, the statuses a run may move to next (the lifecycle table)."""

FINISH_STATUSES: frozenset[RunStatus] = TERMINAL_STATUSES
"""The outcomes :meth:`Store.finish` accepts; ``queued``/``running`` have their own methods."""

# Members read once: read as an attribute of the enum class, a member costs
# a Python-level call (EnumType defines __getattr__), and every run's
# records read these.
_RUNNING: Final = RunStatus.RUNNING
_SKIPPED: Final = RunStatus.SKIPPED


def is_terminal(status: RunStatus) -> bool:
    """Whether a run in ``status`` is done for good (and may be pruned).

    True for ``usage_limited`` too: see :data:`TERMINAL_STATUSES`.
    """
    return status in TERMINAL_STATUSES


def check_transition(run_id: str, current: RunStatus, target: RunStatus) -> None:
    """Raise :class:`StoreConflict` unless ``current → target`` is in the lifecycle table."""
    if target not in LEGAL_TRANSITIONS[current]:
        raise StoreConflict(
            f"run {run_id!r} is {current.value}; it cannot become {target.value}"
            f" (allowed from {current.value}: {_allowed(current)})"
        )


def _allowed(status: RunStatus) -> str:
    targets = sorted(t.value for t in LEGAL_TRANSITIONS[status])
    return ", ".join(targets) if targets else "nothing, it is final"


def not_found(run_id: str) -> RunNotFound:
    """The error for a state change on an unknown run id."""
    return RunNotFound(f"no run with id {run_id!r}")


def not_queued(record: RunRecord) -> StoreConflict:
    """The error for :meth:`Store.cancel_queued` on a run that is not queued."""
    return StoreConflict(
        f"run {record.id!r} is {record.status.value}; it cannot become cancelled this way:"
        " only a queued run can be (stop a running run's process, then record it with finish())"
    )


# Run records and submissions are frozen *dict* classes, not slotted ones:
# attrs builds a frozen slotted instance through object.__setattr__, a call
# per field, while a frozen dict class's __init__ stores each field straight
# into the instance's __dict__. A 23-field RunRecord costs about 9,800
# instructions to build that way against 21,200 slotted (cachegrind), and
# every run builds three (submit, start, finish); the price is about 120
# bytes more per record held (docs/performance.md, "Run records").
@attrs.frozen(slots=False)
class NewRun:
    """A run as submitted: what to run, where, and who to tell.

    ``metadata`` is free-form JSON the caller attaches; the store keeps a
    normalised copy (see :func:`normalise_metadata`).
    """

    id: str
    provider: str
    prompt: str
    conversation: str | None = None
    agent: str | None = None
    workspace: str = DEFAULT_WORKSPACE
    callback_url: str | None = None
    # Excluded from the hash (dicts are unhashable) but still compared.
    metadata: Mapping[str, JSON] = attrs.field(factory=dict, hash=False)
    #: The run's working directory (absolute, resolved), if it names one.
    cwd: str | None = None


@attrs.frozen(slots=False)  # see NewRun
class RunRecord:
    """A run as the ledger holds it: the submission plus everything that happened.

    ``seq`` is the submission order, assigned by the store, strictly
    increasing and never reused (not even after :meth:`Store.prune`).
    ``attempts`` counts starts: 0 while first queued, 1 once running, and one
    more for every start after a re-queue. Records are values; treat
    ``metadata`` as read-only.
    """

    id: str
    provider: str
    prompt: str
    conversation: str | None
    agent: str | None
    workspace: str
    callback_url: str | None
    metadata: Mapping[str, JSON] = attrs.field(hash=False)
    seq: int
    status: RunStatus
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    account: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    result: str | None = None
    session_id: str | None = None
    excerpt: str | None = None
    log_path: str | None = None
    attempts: int = 0
    #: The run's working directory (absolute, resolved), if it named one.
    cwd: str | None = None
    #: Things worth knowing that are not the outcome, e.g. a repository that
    #: could not be checked out for this run. Appended by ``add_note``.
    notes: tuple[str, ...] = ()
    #: What its last attempt spent, as its agent's stream reported it (None:
    #: not finished, or the stream said nothing of it).
    spend: Spend | None = None

    @property
    def is_terminal(self) -> bool:
        """Whether this run is done for good."""
        return is_terminal(self.status)


_RECORD_FIELDS = tuple(field.name for field in attrs.fields(RunRecord))
_FIELD_NAMES = frozenset(_RECORD_FIELDS)


def _changed(record: RunRecord, changes: Mapping[str, object]) -> RunRecord:
    """``attrs.evolve(record, **changes)``, without a call of ``__init__``.

    A run's start and finish (and any re-queue or note) go through here.
    RunRecord's ``__init__`` only stores each field into the instance's
    ``__dict__``, in field order (no converters, validators or hooks: a
    test keeps it so), so the record it would build has the old record's
    ``__dict__`` with the changes written over it. The copy gets that
    dict directly, set as attrs sets attributes of a frozen instance:
    7,500 instructions, against 15,500 for passing the 23 values to
    ``__init__`` (docs/performance.md, "Run records").
    The changes come as one mapping, not keywords: a keyword call packs
    them into a new dict again at every call.
    """
    if not changes.keys() <= _FIELD_NAMES:
        unknown = min(changes.keys() - _FIELD_NAMES)
        raise AttributeError(f"RunRecord has no field {unknown!r}")
    return _evolved(record, changes)


_new = object.__new__
_set = object.__setattr__


def _evolved(record: RunRecord, changes: Mapping[str, object]) -> RunRecord:
    """:func:`_changed` for changes whose every key is a field (the functions below).

    Their changes are written out as literal mappings, so checking their
    names at every state change (twice a run) would check a constant.
    """
    fields = record.__dict__.copy()
    fields.update(changes)
    copy = _new(RunRecord)
    _set(copy, "__dict__", fields)
    return copy


@attrs.frozen(slots=True)
class RunEnd:
    """How an attempt of a run ended, as the ledger records it (:meth:`Store.finish`).

    ``status`` is the outcome, a terminal status other than ``queued`` or
    ``running``; every other field is recorded exactly as given, ``None``
    included (which clears what an earlier attempt left). ``exit_code``,
    ``result``, ``session_id`` and ``excerpt`` come from the agent's
    process; ``reason`` says why it ended as it did; ``log_path`` is where
    its output was kept. ``usage`` is what the agent's stream said the
    attempt spent (the ledger keeps its :class:`Spend`).
    """

    status: RunStatus
    exit_code: int | None = None
    reason: str | None = None
    result: str | None = None
    session_id: str | None = None
    excerpt: str | None = None
    log_path: str | None = None
    usage: RunUsage | None = None


@attrs.frozen(slots=True)
class Attempt:
    """An earlier attempt of a run, kept when the run went back to the queue.

    A run re-queued after a usage limit or retried after a transient failure
    loses its attempt's outcome from its own record (:func:`requeued`); the
    ledger keeps it here first. ``attempt`` counts from 1; ``failure`` is
    the class a retry was made for (None: a usage limit's re-queue);
    ``retry_at`` when the retry was due (unix seconds); ``spend`` what the
    attempt spent; ``held_by`` the fleet member that ran it (None: a
    supervisor that held the ledger alone). The run's last attempt is the
    run's own record.
    """

    run_id: str
    attempt: int
    status: RunStatus
    account: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    failure: str | None = None
    retry_at: float | None = None
    spend: Spend | None = None
    held_by: str | None = None


def attempt_of(
    record: RunRecord,
    failure: str | None,
    retry_at: float | None,
    held_by: str | None = None,
) -> Attempt:
    """The attempt a finished ``record`` holds, as :class:`Attempt` keeps it.

    ``held_by``: the fleet member that held the run for it (None outside a fleet).
    """
    return Attempt(
        record.id,
        record.attempts,
        record.status,
        record.account,
        record.started_at,
        record.finished_at,
        record.exit_code,
        record.reason,
        failure,
        retry_at,
        record.spend,
        held_by,
    )


@attrs.frozen(slots=True)
class Session:
    """The provider session a conversation resumes, and where it lives.

    ``account`` is the account whose config directory holds the session (a
    session is only resumable from there); ``None`` is the provider's
    ambient environment.
    """

    provider: str
    workspace: str
    conversation: str
    session_id: str
    account: str | None


@attrs.frozen(slots=True)
class AccountLimit:
    """An account that hit its provider's usage limit, and until when it stays limited.

    ``account`` ``None`` is the provider's ambient environment; ``until`` is
    unix seconds; ``message`` is what the provider said.
    """

    provider: str
    account: str | None
    until: float
    message: str


def new_record(
    new: NewRun, seq: int, now: float, status: RunStatus, reason: str | None = None
) -> RunRecord:
    """The record a store creates for ``new`` (queued, or skipped straight away)."""
    if not all_plain(
        new.id,
        new.provider,
        new.prompt,
        new.conversation,
        new.agent,
        new.workspace,
        new.callback_url,
        reason,
        new.cwd,
    ):
        check_texts(
            new.id,
            {
                "id": new.id,
                "provider": new.provider,
                "prompt": new.prompt,
                "conversation": new.conversation,
                "agent": new.agent,
                "workspace": new.workspace,
                "callback_url": new.callback_url,
                "reason": reason,
                "cwd": new.cwd,
            },
        )
    metadata = new.metadata
    return RunRecord(
        id=new.id,
        provider=new.provider,
        prompt=new.prompt,
        conversation=new.conversation,
        agent=new.agent,
        workspace=new.workspace,
        callback_url=new.callback_url,
        metadata=normalise_metadata(new.id, metadata) if metadata else {},  # its own first test
        seq=seq,
        status=status,
        submitted_at=now,
        finished_at=now if status is _SKIPPED else None,
        reason=reason,
        cwd=new.cwd,
    )


def started(record: RunRecord, now: float, account: str | None) -> RunRecord:
    """``record`` moved from queued to running."""
    if _RUNNING not in LEGAL_TRANSITIONS[record.status]:  # check_transition's test
        check_transition(record.id, record.status, _RUNNING)
    if account is not None and (not account.isascii() or "\0" in account):  # as all_plain
        check_text(record.id, account=account)
    return _evolved(
        record,
        {
            "status": _RUNNING,
            "started_at": now,
            "account": account,
            "attempts": record.attempts + 1,
        },
    )


def finished(record: RunRecord, end: RunEnd, now: float, before: Tokens | None = None) -> RunRecord:
    """``record`` moved to the outcome ``end.status``; the outcome fields are set as given.

    ``before``: what earlier runs of the session spent, for a stream that
    reports session totals (the store sums them: see :func:`needs_before`).
    """
    status = end.status
    if status not in FINISH_STATUSES:
        raise StoreError(
            f"finish() takes an outcome status, not {status.value}"
            f" (outcomes: {', '.join(sorted(s.value for s in FINISH_STATUSES))})"
        )
    if status not in LEGAL_TRANSITIONS[record.status]:  # check_transition's test
        check_transition(record.id, record.status, status)
    changes = {
        "status": status,
        "finished_at": now,
        "exit_code": end.exit_code,
        "reason": end.reason,
        "result": end.result,
        "session_id": end.session_id,
        "excerpt": end.excerpt,
        "log_path": end.log_path,
        "spend": None if end.usage is None else spend_of(end.usage, before),
    }
    if not all_plain(end.reason, end.result, end.session_id, end.excerpt, end.log_path):
        check_texts(
            record.id,
            {
                "reason": end.reason,
                "result": end.result,
                "session_id": end.session_id,
                "excerpt": end.excerpt,
                "log_path": end.log_path,
            },
        )
    return _evolved(record, changes)


def needs_before(end: RunEnd) -> bool:
    """Whether recording ``end`` takes what earlier runs of its session spent.

    True for a stream that reports a session's running totals (Codex) when
    the run names its session: a store then sums the spend of the earlier
    runs of that session in the same conversation (the one a session is
    resumed in) and passes it to :func:`finished`.
    """
    usage = end.usage
    return (
        usage is not None
        and usage.session_totals
        and usage.tokens is not None
        and end.session_id is not None
    )


def session_before(
    runs: Iterable[RunRecord],
    current: RunRecord,
    end: RunEnd,
    attempts: Iterable[Attempt] = (),
) -> Tokens | None:
    """What the runs of ``end``'s session before ``current`` spent, among ``runs``.

    The in-memory stores' answer to :func:`needs_before` (the SQL stores
    ask the same of the database): the tokens of the earlier runs of the
    same provider, workspace, conversation and session, summed, and those
    of ``current``'s own earlier ``attempts`` in it (:func:`attempts_in_session`).
    """
    if current.conversation is None:
        return None
    total: Tokens | None = attempts_in_session(current, end, attempts)
    for r in runs:
        spent = r.spend
        if (
            spent is not None
            and spent.tokens is not None
            and r.conversation == current.conversation
            and r.seq < current.seq
            and r.provider == current.provider
            and r.workspace == current.workspace
            and r.session_id == end.session_id
        ):
            total = spent.tokens if total is None else total + spent.tokens
    return total


def ended(record: RunRecord, status: RunStatus, now: float, reason: str) -> RunRecord:
    """``record`` moved to ``status`` with a ``reason`` only: no process outcome to keep.

    A queued run cancelled, or a running run recorded lost.
    """
    return finished(record, RunEnd(status, reason=reason), now)


def requeued(record: RunRecord) -> RunRecord:
    """``record`` moved from usage_limited (or failed, timed_out: a retry) back to queued.

    The attempt's outcome is cleared (a store keeps it as an
    :class:`Attempt`); ``seq`` (its place in submission order), ``attempts``
    and ``session_id`` (to resume the conversation) stay. Legal whenever
    the run is usage_limited (failed, timed_out); that it happens only in the
    batch that recorded usage_limited is the supervisor's rule (see
    :data:`TERMINAL_STATUSES`).
    """
    check_transition(record.id, record.status, RunStatus.QUEUED)
    return _evolved(
        record,
        {
            "status": RunStatus.QUEUED,
            "started_at": None,
            "finished_at": None,
            "account": None,
            "exit_code": None,
            "reason": None,
            "result": None,
            "excerpt": None,
            "log_path": None,
            "spend": None,
        },
    )


def noted(record: RunRecord, note: str) -> RunRecord:
    """``record`` with ``note`` appended to its notes (any status)."""
    check_text(record.id, note=note)
    return _evolved(record, {"notes": (*record.notes, note)})


def attempts_in_session(
    current: RunRecord, end: RunEnd, attempts: Iterable[Attempt]
) -> Tokens | None:
    """What ``current``'s earlier ``attempts`` spent in the session ``end`` reports, summed.

    A retry resumes the session its failed attempt reported, on the account
    that session lives under; a stream that reports session totals (Codex)
    then counts the failed attempt's tokens again. The ledger keeps no
    session per attempt, so the attempts counted are those on the current
    attempt's account, when the current attempt continued the session the
    last one reported (``current.session_id``, which a re-queue keeps);
    None when there are none.
    """
    if end.session_id is None or end.session_id != current.session_id:
        return None
    total: Tokens | None = None
    for attempt in attempts:
        spent = attempt.spend
        if spent is not None and spent.tokens is not None and attempt.account == current.account:
            total = spent.tokens if total is None else total + spent.tokens
    return total
