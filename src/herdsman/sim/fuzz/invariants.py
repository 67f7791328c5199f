"""The fuzzer's oracle: a model of what the supervisor may do, fed everything it does.

The checker keeps its own picture of every run — queued (in submission
order), running, or ended how — built only from what the client sent, what
the supervisor traces and what the fake runner is asked to spawn, and
derives lanes and caps on its own (it never asks the scheduler core, whose
rules it checks). Each traced submit must be the run as sent (its id,
provider, conversation, agent and workspace); lanes come from what was
sent. Each
start is checked against the configuration then in force: provider, global
and account caps; no running run sharing a key; no earlier queued run
sharing a key (FIFO per key); the run queued, not running or ended (no run
started twice). A spawn must answer a start. After a restart, the runs
that were running must be reported lost and those queued re-queued in the
same order. :meth:`Checker.settled` compares the model with the ledger and
the scheduler after every event: no run vanished. :meth:`Checker.drained`
says whether every run has finished (nothing queued or running).
:meth:`Checker.untouched` compares what is outside the state dir
(:func:`snapshot`) with what it should be: nothing there is created,
changed or removed by the supervisor, whatever links were planted in the
state dir.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from herdsman.runtime.store import RunRecord
from herdsman.sim.fuzz.account_checks import AccountChecks, AgentEnd
from herdsman.sim.fuzz.removal_waits import RemovalWaits

__all__ = ["Checker", "Violation", "snapshot"]


@attrs.frozen
class Violation:
    """An invariant that did not hold: which (``kind``), when, and what happened."""

    kind: str
    t: float
    message: str

    def __str__(self) -> str:
        return f"t={self.t:.3f}: {self.kind}: {self.message}"


@attrs.define
class _Run:
    """What the checker knows of one run."""

    id: str
    provider: str
    conversation: str | None
    agent: str | None
    workspace: str
    seq: int
    state: str = "queued"  # queued | running | an ending (succeeded, cancelled, lost...)
    account: str | None = None
    spawned: bool = False


@attrs.frozen
class _Limits:
    """The caps a configuration (as its JSON in the trace) sets."""

    global_cap: int | None
    providers: Mapping[str, int]
    accounts: Mapping[tuple[str, str], int]
    agent_exclusive: bool

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> _Limits:
        providers = config["providers"]
        return cls(
            config["supervisor"].get("max_concurrency"),
            {name: p["concurrency"] for name, p in providers.items()},
            {
                (name, account["name"]): account["concurrency"]
                for name, p in providers.items()
                for account in p.get("accounts", [])
                if account.get("concurrency") is not None
            },
            bool(config["scheduling"]["agent_exclusive"]),
        )


#: A run's identity as a client sends it: each field, and its value when not sent.
_IDENTITY = (
    ("id", None),
    ("provider", None),
    ("conversation", None),
    ("agent", None),
    ("workspace", "default"),
)

TERMINAL = frozenset({"succeeded", "failed", "timed_out", "cancelled", "usage_limited", "lost"})


def snapshot(root: Path) -> dict[str, str]:
    """What is under ``root``, links not followed: each path and what it is.

    A folder is ``dir``, a link ``link -> target``, a file the SHA-256 of its
    content; nothing for a ``root`` that does not exist.
    """
    found: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in sorted([*dirs, *files]):
            path = os.path.join(folder, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                found[path] = f"link -> {os.readlink(path)}"
            elif stat.S_ISDIR(mode):
                found[path] = "dir"
            else:
                with open(path, "rb") as file:
                    found[path] = hashlib.sha256(file.read()).hexdigest()
    return found


class Checker:
    """Follows one fuzz run's trace events and spawns; collects violations.

    ``now`` gives the simulated time that violations are stamped with.
    """

    def __init__(self, now: Any, sent: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._now = now
        # What the client sent for each run (its submit's ``run``), by id: the
        # run's identity is taken from here, and each traced submit checked
        # against it (an intake that loses a field is caught).
        self._sent = sent
        self.violations: list[Violation] = []
        self._runs: dict[str, _Run] = {}  # insertion order is submission order
        self._skipped: set[str] = set()  # membership only
        self._limits: _Limits | None = None
        self._seq = 0
        # At a restart: the runs the dead supervisor had running, and queued in order.
        self._expect_lost: set[str] | None = None
        self._expect_queued: list[str] | None = None
        #: Removals under way, told by the fake git, against the traced waits for them.
        self.removals = RemovalWaits(self.fail)
        #: Budgets, refused logins and retries (their own model of accounts).
        self.accounts = AccountChecks(self.fail)
        #: Accounts a ``needs_login`` event named, not yet handed to the operator.
        self.logins_needed: list[tuple[str, str | None]] = []

    # -- what happened -----------------------------------------------------

    def fail(self, kind: str, message: str) -> None:
        """Record a violation."""
        self.violations.append(Violation(kind, float(self._now()), message))

    def header(self, config: Mapping[str, Any]) -> None:
        """A supervisor (re)started with ``config``."""
        self._limits = _Limits.of(config)
        self.accounts.configure(config, restart=True)

    def crashed(self) -> None:
        """The supervisor died: what it must restate when it comes back."""
        self.removals.crashed()
        self._expect_lost = {r.id for r in self._runs.values() if r.state == "running"}
        self.accounts.crashed(self._expect_lost)
        self._expect_queued = self._queued_in_order()

    def restarted(self) -> None:
        """The new supervisor has recovered: every running run is lost, every queued one back."""
        lost = self._expect_lost or set()
        missing = sorted(run_id for run_id in lost if self._runs[run_id].state != "lost")
        if missing:
            self.fail("lost", f"running at the crash, not reported lost: {', '.join(missing)}")
        queued = self._expect_queued or []
        if queued:
            self.fail("restart order", f"queued at the crash, not re-queued: {', '.join(queued)}")
        self._expect_lost = self._expect_queued = None

    def event(self, kind: str, fields: Mapping[str, Any]) -> None:
        """One trace event, as the supervisor wrote it."""
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(fields)

    def agent_ended(self, run_id: str, end: AgentEnd) -> None:
        """The fake runner ended ``run_id``'s attempt as its agent said (before its finish)."""
        self.accounts.agent_ended(run_id, end)

    def spawned(self, run_id: str) -> None:
        """The fake runner was asked to run ``run_id``'s process."""
        run = self._runs.get(run_id)
        if run is None or run.state != "running":
            state = "unknown" if run is None else run.state
            self.fail("started twice", f"{run_id} was spawned while {state}, not just started")
        elif run.spawned:
            self.fail("started twice", f"{run_id} was spawned twice for one start")
        else:
            run.spawned = True

    # -- trace events ------------------------------------------------------

    def _on_removal_wait(self, fields: Mapping[str, Any]) -> None:
        run_id = fields["run_id"]
        self.removals.wait((self._sent or {}).get(run_id) or {"id": run_id})

    def _on_submit(self, fields: Mapping[str, Any]) -> None:
        run = fields["run"]
        run_id = run["id"]
        self.removals.submitted(run_id)
        run = self._intake(run)
        if fields.get("carried"):
            self._carried(run_id)
            return
        if run_id in self._runs or run_id in self._skipped:
            self.fail("started twice", f"{run_id} was submitted again as a new run")
            return
        self._seq += 1
        self._runs[run_id] = _Run(
            run_id,
            run["provider"],
            run.get("conversation"),
            run.get("agent"),
            run.get("workspace", "default"),
            self._seq,
        )

    def _intake(self, traced: Mapping[str, Any]) -> Mapping[str, Any]:
        """The run as sent; a violation if the supervisor traced it as something else."""
        if self._sent is None:
            return traced
        run_id = traced["id"]
        sent = self._sent.get(run_id)
        if sent is None:
            self.fail("intake", f"{run_id} was submitted, but no client sent it")
            return traced
        changed = [
            f"{name} {sent.get(name, default)!r} became {traced.get(name, default)!r}"
            for name, default in _IDENTITY
            if sent.get(name, default) != traced.get(name, default)
        ]
        if changed:
            self.fail("intake", f"{run_id} was not recorded as sent: {'; '.join(changed)}")
        return sent

    def _carried(self, run_id: str) -> None:
        expected = self._expect_queued
        if expected is None:
            self.fail("restart order", f"{run_id} restated as queued with no restart")
        elif not expected or expected[0] != run_id:
            wanted = expected[0] if expected else "nothing more"
            self.fail("restart order", f"re-queued {run_id} where {wanted} was next in line")
            if run_id in expected:
                expected.remove(run_id)
        else:
            expected.pop(0)

    def _on_skip(self, fields: Mapping[str, Any]) -> None:
        self._skipped.add(fields["run"]["id"])

    def _on_start(self, fields: Mapping[str, Any]) -> None:
        run_id = fields["run_id"]
        run = self._runs.get(run_id)
        if run is None or run.state != "queued":
            state = "never submitted" if run is None else run.state
            self.fail("started twice", f"{run_id} started while {state}")
            return
        self._check_start(run, fields.get("account"))
        self.accounts.started(run_id, run.provider, fields.get("account"), float(self._now()))
        run.state, run.account, run.spawned = "running", fields.get("account"), False

    def _check_start(self, run: _Run, account: str | None) -> None:
        limits = self._limits
        assert limits is not None
        running = [r for r in self._runs.values() if r.state == "running"]
        same = [r for r in running if r.provider == run.provider]
        cap = limits.providers.get(run.provider)
        if cap is not None and len(same) + 1 > cap:
            self.fail("cap", f"{run.id} started as {run.provider}'s run {len(same) + 1} of {cap}")
        if limits.global_cap is not None and len(running) + 1 > limits.global_cap:
            self.fail("cap", f"{run.id} started as run {len(running) + 1} of {limits.global_cap}")
        account_cap = limits.accounts.get((run.provider, account or ""))
        on_account = [r for r in same if r.account == account]
        if account_cap is not None and len(on_account) + 1 > account_cap:
            self.fail(
                "cap",
                f"{run.id} started as account {account}'s run {len(on_account) + 1}"
                f" of {account_cap}",
            )
        keys = self._keys(run)
        for other in running:
            shared = keys & self._keys(other)
            if shared:
                self.fail("lane", f"{run.id} started while {other.id} runs on {min(shared)}")
        for other in self._runs.values():
            ahead = keys & self._keys(other)
            if other.state == "queued" and other.seq < run.seq and ahead:
                waits = other.id in self.accounts.backoff
                self.fail(
                    "retry order" if waits else "fifo",
                    f"{run.id} started before {other.id}, queued earlier on {min(ahead)}"
                    + (", waiting out a retry's backoff" if waits else ""),
                )

    def _keys(self, run: _Run) -> set[str]:
        # Derived here, not by the scheduler core: it is the core being checked.
        assert self._limits is not None
        keys = set()
        if run.conversation is not None:
            keys.add(f"conversation:{run.workspace}/{run.conversation}")
        if run.agent is not None and self._limits.agent_exclusive:
            keys.add(f"agent:{run.workspace}/{run.agent}")
        return keys

    def _in_state(self, run_id: str, state: str, what: str) -> _Run | None:
        """The run, if it is in ``state``; else a violation saying it ``what`` then."""
        run = self._runs.get(run_id)
        if run is None or run.state != state:
            self.fail(
                "vanished", f"{run_id} {what} while {'unknown' if run is None else run.state}"
            )
            return None
        return run

    def _on_finish(self, fields: Mapping[str, Any]) -> None:
        run = self._in_state(fields["run_id"], "running", "finished")
        if run is not None:
            run.state = "queued" if fields.get("requeued") else fields["outcome"]
            self.accounts.finished(run.id, fields, float(self._now()))

    def _on_retry(self, fields: Mapping[str, Any]) -> None:
        run = self._in_state(fields["run_id"], "running", "was retried")
        if run is not None:
            self.accounts.retried(run.id, run.provider, fields)

    def _on_needs_login(self, fields: Mapping[str, Any]) -> None:
        self.logins_needed.append((fields["provider"], fields.get("account")))

    def _on_rest_ended(self, fields: Mapping[str, Any]) -> None:
        self.accounts.rest_ended(fields["provider"], fields.get("account"))

    def _on_cancel(self, fields: Mapping[str, Any]) -> None:
        run = self._in_state(fields["run_id"], "queued", "withdrawn from the queue")
        if run is not None:
            run.state = "cancelled"
            self.accounts.withdrawn(run.id)

    def _on_lost(self, fields: Mapping[str, Any]) -> None:
        run_id = fields["run_id"]
        run = self._runs.get(run_id)
        if self._expect_lost is None or run_id not in self._expect_lost or run is None:
            self.fail("lost", f"{run_id} reported lost, but it was not running at a crash")
            return
        run.state = "lost"

    def _on_reload(self, fields: Mapping[str, Any]) -> None:
        self._limits = _Limits.of(fields["config"])
        self.accounts.configure(fields["config"], restart=False)

    # -- after each event --------------------------------------------------

    def _queued_in_order(self) -> list[str]:
        return [
            r.id for r in sorted(self._runs.values(), key=lambda r: r.seq) if r.state == "queued"
        ]

    def settled(self, records: Iterable[RunRecord | None], counts: Mapping[str, int]) -> None:
        """Compare the model with the ledger (``records``, one per run in submission
        order) and the scheduler's ``counts`` of queued and running runs."""
        for run, record in zip(self._runs.values(), records, strict=True):
            if record is None:
                self.fail("vanished", f"{run.id} ({run.state}) is no longer in the ledger")
                continue
            if record.status.value != run.state:
                self.fail(
                    "vanished",
                    f"{run.id} is {record.status.value} in the ledger but {run.state} by its trace",
                )
        for state in ("queued", "running"):
            mine = sum(1 for r in self._runs.values() if r.state == state)
            held = counts.get("parked", 0) if state == "queued" else 0
            # A run waiting out a retry's backoff is queued, held apart (parked).
            if counts[state] + held != mine:
                self.fail(
                    "vanished", f"the scheduler holds {counts[state]} {state} run(s); {mine} are"
                )

    def untouched(self, expected: Mapping[str, str], now: Mapping[str, str]) -> None:
        """A violation naming the first path outside the state dir that is not as ``expected``.

        Both are :func:`snapshot` results; ``expected`` is what the faults
        themselves left there.
        """
        for path in sorted(expected.keys() | now.keys()):
            was, is_now = expected.get(path), now.get(path)
            if was != is_now:
                what = (
                    "was created"
                    if was is None
                    else "was removed"
                    if is_now is None
                    else f"changed ({was} became {is_now})"
                )
                self.fail("outside touched", f"{path}, outside the state dir, {what}")
                return

    @property
    def run_ids(self) -> list[str]:
        """Every run submitted, in submission order."""
        return list(self._runs)

    def unsettled(self) -> bool:
        """Whether a run is queued or running."""
        return any(r.state in ("queued", "running") for r in self._runs.values())

    def busy(self, workspace: str, conversation: str) -> bool:
        """Whether the conversation has a queued or running run, as the model says."""
        return any(
            r.workspace == workspace and r.conversation == conversation
            for r in self._runs.values()
            if r.state in ("queued", "running")
        )

    def drained(self, why: str) -> bool:
        """Whether every run has finished; a violation saying ``why`` it should have if not.

        A run still queued, or still running (its end never came), never finished.
        """
        left = [
            f"{r.id} ({r.state})"
            for r in sorted(self._runs.values(), key=lambda r: r.seq)
            if r.state in ("queued", "running")
        ]
        if left:
            shown = ", ".join(left[:5]) + (" ..." if len(left) > 5 else "")
            self.fail("drain", f"{len(left)} run(s) never finished {why}: {shown}")
        return not left
