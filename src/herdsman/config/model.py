# ruff: noqa: RUF009  -- `setting()` wraps attrs.field(); ruff only recognises the latter.
"""The configuration model: frozen attrs classes, one per TOML table.

Each field's metadata carries its :mod:`kind <herdsman.config.kinds>` (how the
raw TOML value is checked and normalised) and a one-line ``doc``. A field with
an attrs default is optional and takes that default; ``default_from`` computes
a default that depends on the environment or on other settings. Instances are
only built by :func:`herdsman.config.load_config`, after validation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from herdsman.config import kinds
from herdsman.config.durations import format_duration
from herdsman.core.retry import DEFAULT_RETRY_ON, Failure

if TYPE_CHECKING:
    from herdsman.config.keypath import KeyPath
    from herdsman.config.validate import Checker

__all__ = [
    "RESTART_FIELDS",
    "Account",
    "ApiSettings",
    "Config",
    "FleetSettings",
    "Provider",
    "Repo",
    "RetentionSettings",
    "Retry",
    "SchedulingSettings",
    "StoreSettings",
    "SupervisorSettings",
    "TraceSettings",
    "default_state_dir",
]

DefaultFrom = Callable[["Checker"], Any]


def setting(
    kind: kinds.Kind,
    doc: str,
    *,
    default: Any = attrs.NOTHING,
    factory: Callable[[], Any] | None = None,
    default_from: DefaultFrom | None = None,
    restart: bool = False,
) -> Any:
    """Declare a field with its kind and documentation (see the module docstring).

    ``restart``: a running supervisor cannot take a new value over (where
    the ledger, the API or the trace live); a reload keeps the running one
    and reports the change as waiting for a restart.
    """
    return attrs.field(
        default=attrs.Factory(factory) if factory is not None else default,
        kw_only=True,
        metadata={"kind": kind, "doc": doc, "default_from": default_from, "restart": restart},
    )


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """``$XDG_STATE_HOME/herdsman``, else ``~/.local/state/herdsman``.

    A relative ``XDG_STATE_HOME`` is ignored, as the XDG spec asks.
    """
    xdg = environ.get("XDG_STATE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "herdsman"
    return Path("~/.local/state/herdsman").expanduser()


def under_state_dir(name: str) -> DefaultFrom:
    """A default of ``<state_dir>/<name>``, following whatever state_dir became."""

    def default(checker: Checker) -> Path | None:
        state_dir = checker.value_of(("supervisor", "state_dir"))
        return state_dir / name if isinstance(state_dir, Path) else None

    return default


def _account_budget(
    raw: Mapping[str, Any], out: dict[str, Any], path: KeyPath, checker: Checker
) -> None:
    if "budget" in raw and "window" not in raw:
        checker.problem(
            (*path, "budget"),
            'requires a window to count it in, e.g. window = "5h"; window is not set',
        )
    budget, unit = out.get("budget"), out.get("budget_unit")
    if isinstance(budget, float) and unit in _WHOLE_UNITS:
        if budget.is_integer():
            out["budget"] = int(budget)  # 5e6 tokens: a whole number written as a float
        else:
            checker.problem(
                (*path, "budget"),
                f'must be a whole number of {_WHOLE_UNITS[unit]} with budget_unit = "{unit}"'
                f' (only budget_unit = "usd" takes dollars and cents), got {budget!r}',
            )


#: The budget units counted in whole numbers, and what they count.
_WHOLE_UNITS: Final = {"runs": "runs", "run_minutes": "run-minutes", "tokens": "tokens"}

#: The budget units a protocol's stream states the figures of.
_UNITS_READ: Final = {
    "plain": ("runs", "run_minutes"),
    "codex": ("runs", "run_minutes", "tokens"),
    "claude": ("runs", "run_minutes", "tokens", "usd"),
}


def _provider_checks(
    raw: Mapping[str, Any], out: dict[str, Any], path: KeyPath, checker: Checker
) -> None:
    _resume_needs_session(raw, out, path, checker)
    # A budget in a figure the stream never states would count nothing, and
    # so never hold: refused rather than silently not enforced.
    protocol = out.get("protocol")
    readable = _UNITS_READ.get(protocol) if isinstance(protocol, str) else None
    if readable is None:
        return
    choices = ", ".join(f'"{known}"' for known in readable)
    for index, account in enumerate(out.get("accounts") or ()):
        unit = account.get("budget_unit")
        if account.get("budget") is not None and unit not in readable:
            checker.problem(
                (*path, "accounts", index, "budget_unit"),
                f'"{unit}" counts what the agent\'s stream states, and a protocol = "{protocol}"'
                f" stream states no {_FIGURE[unit]}; use one of {choices}"
                ' (or protocol = "claude" if the provider is Claude Code)',
            )


_FIGURE: Final = {"tokens": "token counts", "usd": "cost"}


def _resume_needs_session(
    raw: Mapping[str, Any], out: dict[str, Any], path: KeyPath, checker: Checker
) -> None:
    args = out.get("resume_args")
    if args and not any("{session}" in arg for arg in args):
        checker.problem(
            (*path, "resume_args"),
            'must contain "{session}" where the session id goes, e.g. ["--resume", "{session}"]',
        )


@attrs.frozen(kw_only=True)
class SupervisorSettings:
    """``[supervisor]``: the process as a whole."""

    state_dir: Path = setting(
        kinds.PathValue(),
        "where herdsman keeps its ledger, worktrees and traces",
        default_from=lambda checker: default_state_dir(checker.environ),
        restart=True,
    )
    max_concurrency: int | None = setting(
        kinds.WholeNumber(1),
        "machine-wide cap on runs across all providers; absent means no global cap",
        default=None,
    )
    shutdown_grace: timedelta = setting(
        kinds.Duration(),
        "how long running runs may finish after the first SIGINT/SIGTERM",
        default=timedelta(minutes=10),
    )
    parallel_preamble: bool = setting(
        kinds.Boolean(),
        "when runs may execute side by side, prepend a short note saying so to each prompt",
        default=True,
    )


@attrs.frozen(kw_only=True)
class StoreSettings:
    """``[store]``: where the run ledger lives."""

    url: str | None = setting(
        kinds.PostgresUrl(),
        "a PostgreSQL URL for the ledger; absent means SQLite in <state_dir>/herdsman.db",
        default=None,
        restart=True,
    )


#: The range a fleet lease may take: long enough to be renewed three times
#: over a slow link, short enough that a dead member's runs do not wait for
#: hours before they are declared lost.
LEASE_RANGE = (timedelta(seconds=3), timedelta(hours=1))


def _fleet_rules(
    raw: Mapping[str, Any], out: dict[str, Any], path: KeyPath, checker: Checker
) -> None:
    lease, poll = out.get("lease"), out.get("poll")
    low, high = LEASE_RANGE
    if isinstance(lease, timedelta) and not low <= lease <= high:
        checker.problem(
            (*path, "lease"),
            f'must be from "{low.seconds}s" to "1h", got {kinds.describe(raw["lease"])}',
        )
    elif isinstance(lease, timedelta) and isinstance(poll, timedelta) and poll >= lease:
        checker.problem(
            (*path, "poll"),
            f"must be shorter than the lease ({checker.where((*path, 'lease'))}), "
            f"got {kinds.describe(raw['poll'])}",
        )
    if out.get("enabled") and checker.value_of(("store", "url")) is None:
        checker.problem(
            (*path, "enabled"),
            "fleet mode needs a PostgreSQL ledger the members share, but store.url is not"
            ' set; add [store] url = "postgresql://HOST/DATABASE"',
        )
    providers: dict[str, set[str]] = {}
    for key in checker.values:
        if key[:1] == ("providers",) and len(key) >= 3:
            accounts = providers.setdefault(str(key[1]), set())
            if len(key) == 5 and key[2] == "accounts" and key[4] == "name":
                accounts.add(checker.values[key])
    known = ", ".join(sorted(providers)) or "(none)"
    # The names are read from the file, not from what structured: a cap of
    # the wrong kind leaves its table out, and every other entry's name must
    # still be checked (every error is reported at once).
    for provider in _table(raw.get("provider_caps")):
        if provider not in providers:
            checker.problem(
                (*path, "provider_caps", provider),
                f"names no provider of this file; the providers are: {known}",
                "key",
            )
    for provider, accounts in _table(raw.get("account_caps")).items():
        if provider not in providers:
            checker.problem(
                (*path, "account_caps", provider),
                f"names no provider of this file; the providers are: {known}",
                "key",
            )
            continue
        names = ", ".join(sorted(providers[provider])) or "(none)"
        for account in _table(accounts):
            if account not in providers[provider]:
                checker.problem(
                    (*path, "account_caps", provider, account),
                    f"names no account of providers.{provider}; its accounts are: {names}",
                    "key",
                )


def _table(value: object) -> Mapping[str, Any]:
    """``value`` if it is a table, else an empty one (its kind is reported elsewhere)."""
    return value if isinstance(value, Mapping) else {}


@attrs.frozen(kw_only=True)
class FleetSettings:
    """``[fleet]``: this supervisor as one member of a fleet sharing a PostgreSQL ledger."""

    # Joining or leaving a fleet changes which ledger rules bind this
    # supervisor (recovery at start, claims): only a start can do that.
    enabled: bool = setting(
        kinds.Boolean(),
        "join the fleet of supervisors sharing the ledger at store.url",
        default=False,
        restart=True,
    )
    lease: timedelta = setting(
        kinds.Duration(positive=True),
        "how long this member counts as alive without renewing; its runs are lost after it",
        default=timedelta(seconds=30),
    )
    poll: timedelta = setting(
        kinds.Duration(positive=True),
        "how often the ledger is read for runs submitted to other members and retried claims",
        default=timedelta(seconds=1),
    )
    provider_caps: Mapping[str, int] = setting(
        kinds.Caps(), "fleet-wide cap on a provider's simultaneous runs", factory=dict
    )
    account_caps: Mapping[str, Mapping[str, int]] = setting(
        kinds.Caps(nested=True),
        "fleet-wide cap on the simultaneous runs spending an account, per provider",
        factory=dict,
    )


@attrs.frozen(kw_only=True)
class SchedulingSettings:
    """``[scheduling]``: rules the scheduler applies to every run."""

    agent_exclusive: bool = setting(
        kinds.Boolean(), "at most one run per workspace+agent at a time", default=True
    )


@attrs.frozen(kw_only=True)
class Account:
    """``[[providers.NAME.accounts]]``: one account a provider's runs can spend."""

    name: str = setting(
        kinds.Name(r"[A-Za-z0-9_.-]+", "a name of letters, digits, '_', '.' and '-'"),
        "unique within the provider",
    )
    env: Mapping[str, str] = setting(
        kinds.StringTable(), "environment added to runs that spend this account", factory=dict
    )
    window: timedelta | None = setting(
        kinds.Duration(positive=True), 'rolling quota window, e.g. "5h"', default=None
    )
    budget: float | None = setting(
        kinds.Amount(),
        "runs, run-minutes, tokens or US dollars allowed per window (needs window)",
        default=None,
    )
    budget_unit: Literal["runs", "run_minutes", "tokens", "usd"] = setting(
        kinds.Choice(("runs", "run_minutes", "tokens", "usd")),
        "what budget counts",
        default="runs",
    )
    concurrency: int | None = setting(
        kinds.WholeNumber(1, 64), "cap on this account's simultaneous runs", default=None
    )


_FAILURES = tuple(failure.value for failure in Failure)


def _retry_rules(
    raw: Mapping[str, Any], out: dict[str, Any], path: KeyPath, checker: Checker
) -> None:
    on, after_work = out.get("on"), out.get("after_work")
    if on is not None and after_work is not None:
        for number, name in enumerate(after_work):
            if name not in on:
                checker.problem(
                    (*path, "after_work", number),
                    f'lists "{name}", which on does not retry: add it to on, or remove it here',
                )
    backoff, cap = out.get("backoff"), out.get("backoff_max")
    if backoff is not None and cap is not None and cap < backoff:
        checker.problem(
            (*path, "backoff_max"),
            f"must be at least backoff ({format_duration(backoff)}), got {format_duration(cap)}",
        )


@attrs.frozen(kw_only=True)
class Retry:
    """``[providers.NAME.retry]``: which failed attempts of a run are tried again, and when.

    docs/operations.md ("Retries") says what each failure class is and when
    the agent is taken to have done work.
    """

    attempts: int = setting(
        kinds.WholeNumber(1, 20),
        "attempts of a run at most, the first included; 1: no retry",
        default=3,
    )
    on: tuple[str, ...] = setting(
        kinds.ChoiceList(_FAILURES),
        "failure classes that retry an attempt in which the agent did no work",
        factory=lambda: tuple(f.value for f in Failure if f in DEFAULT_RETRY_ON),
    )
    after_work: tuple[str, ...] = setting(
        kinds.ChoiceList(_FAILURES),
        "classes of on that retry even after the agent may have done some work",
        factory=tuple,
    )
    backoff: timedelta = setting(
        kinds.Duration(positive=True),
        "delay before the second attempt, doubled before each later one",
        default=timedelta(seconds=30),
    )
    backoff_max: timedelta = setting(
        kinds.Duration(positive=True), "cap on a delay", default=timedelta(minutes=10)
    )


@attrs.frozen(kw_only=True)
class Provider:
    """``[providers.NAME]``: a command that reads a prompt on stdin."""

    exec: tuple[str, ...] = setting(
        kinds.StringList(), "the command and its arguments; the prompt arrives on stdin"
    )
    concurrency: int = setting(
        kinds.WholeNumber(1, 64), "simultaneous runs of this provider", default=1
    )
    timeout: timedelta | None = setting(
        kinds.Duration(zero_is_none=True),
        'wall-clock limit per run; "0" (None) means none',
        default=None,
    )
    idle_timeout: timedelta | None = setting(
        kinds.Duration(zero_is_none=True),
        'limit on a run\'s silence (no output); "0" (None) means none',
        default=timedelta(minutes=15),
    )
    env: Mapping[str, str] = setting(
        kinds.StringTable(), "environment added to every run", factory=dict
    )
    protocol: Literal["plain", "claude", "codex"] = setting(
        kinds.Choice(("plain", "claude", "codex")), "how the output stream is read", default="plain"
    )
    workdir: Path = setting(
        kinds.PathValue(),
        "working directory for runs (default <state_dir>/workspace)",
        default_from=under_state_dir("workspace"),
    )
    resume_args: tuple[str, ...] = setting(
        kinds.StringList(non_empty=False, example='["--resume", "{session}"]'),
        "arguments appended to exec to resume a conversation's session; {session} is its id",
        factory=tuple,
    )
    usage_limit_pattern: str | None = setting(
        kinds.Regex(),
        'regex that marks a plain CLI\'s output as "usage limit reached"',
        default=None,
    )
    accounts: tuple[Account, ...] = setting(
        kinds.ArrayOfTables(
            kinds.Table(Account, _account_budget), unique="name", scope=" in this provider"
        ),
        "accounts this provider's runs can spend",
        factory=tuple,
    )
    retry: Retry = setting(
        kinds.Table(Retry, _retry_rules),
        "which failed attempts are tried again, and when",
        factory=Retry,
    )


@attrs.frozen(kw_only=True)
class Repo:
    """``[[repos]]``: a git checkout each conversation gets its own worktree of."""

    name: str = setting(
        kinds.Name(r"[A-Za-z0-9._-]+", "a name of letters, digits, '.', '_' and '-'", (".", "..")),
        "unique across repos; names the worktree folder",
    )
    path: Path = setting(kinds.PathValue(), "the git checkout")


@attrs.frozen(kw_only=True)
class RetentionSettings:
    """``[retention]``: when idle worktrees are removed."""

    idle: timedelta = setting(
        kinds.Duration(),
        "idleness after which a clean worktree is removed",
        default=timedelta(days=14),
    )
    sweep_interval: timedelta = setting(
        kinds.Duration(positive=True), "how often the sweeper looks", default=timedelta(hours=1)
    )
    finished_runs: timedelta = setting(
        kinds.Duration(positive=True),
        "how long finished runs stay in the ledger before they are pruned",
        default=timedelta(days=30),
    )


@attrs.frozen(kw_only=True)
class ApiSettings:
    """``[api]``: the HTTP API."""

    listen: str = setting(
        kinds.Listen(), "HOST:PORT to listen on", default="127.0.0.1:7878", restart=True
    )
    token_file: Path = setting(
        kinds.PathValue(),
        "file holding the bearer token clients must send (default <state_dir>/api-token)",
        default_from=under_state_dir("api-token"),
        restart=True,
    )
    max_body_bytes: int = setting(
        kinds.WholeNumber(65_536),
        "largest request body accepted; a larger one is refused with 413 before it is read",
        default=16_777_216,
    )
    body_timeout: timedelta = setting(
        kinds.Duration(positive=True),
        "time a request's body may take to arrive after its headers; then 408 and closed",
        default=timedelta(seconds=30),
    )

    @property
    def host(self) -> str:
        """The host part of ``listen``, without IPv6 brackets."""
        return self.listen.rpartition(":")[0].removeprefix("[").removesuffix("]")

    @property
    def port(self) -> int:
        """The port part of ``listen``."""
        return int(self.listen.rpartition(":")[2])


@attrs.frozen(kw_only=True)
class TraceSettings:
    """``[trace]``: the JSON Lines decision trace."""

    enabled: bool = setting(
        kinds.Boolean(), "write a trace of every decision", default=True, restart=True
    )
    record_prompts: bool = setting(
        kinds.Boolean(), "include each run's prompt in its submit event", default=False
    )
    dir: Path = setting(
        kinds.PathValue(),
        "where trace files go (default <state_dir>/traces)",
        default_from=under_state_dir("traces"),
        restart=True,
    )
    max_bytes: int = setting(
        kinds.WholeNumber(4096),
        "size at which a trace file is rotated",
        default=268_435_456,
        restart=True,
    )


@attrs.frozen(kw_only=True)
class Config:
    """The whole ``supervisor.toml``."""

    supervisor: SupervisorSettings = setting(kinds.Table(SupervisorSettings), "[supervisor]")
    scheduling: SchedulingSettings = setting(kinds.Table(SchedulingSettings), "[scheduling]")
    store: StoreSettings = setting(kinds.Table(StoreSettings), "[store]")
    providers: Mapping[str, Provider] = setting(
        kinds.NamedTables(
            kinds.Table(Provider, _provider_checks),
            min_count=1,
            noun="provider is",
            example='[providers.claude] with exec = ["claude", "-p"]',
        ),
        "[providers.NAME]",
        factory=dict,
    )
    fleet: FleetSettings = setting(kinds.Table(FleetSettings, _fleet_rules), "[fleet]")
    repos: tuple[Repo, ...] = setting(
        kinds.ArrayOfTables(kinds.Table(Repo), unique="name"), "[[repos]]", factory=tuple
    )
    retention: RetentionSettings = setting(kinds.Table(RetentionSettings), "[retention]")
    api: ApiSettings = setting(kinds.Table(ApiSettings), "[api]")
    trace: TraceSettings = setting(kinds.Table(TraceSettings), "[trace]")


def _restart_fields() -> Mapping[str, tuple[str, ...]]:
    """Each ``[table]``'s fields declared ``restart=True``, in model order."""
    found: dict[str, tuple[str, ...]] = {}
    for section in attrs.fields(Config):
        kind = section.metadata["kind"]
        if isinstance(kind, kinds.Table):
            names = tuple(f.name for f in attrs.fields(kind.cls) if f.metadata.get("restart"))
            if names:
                found[section.name] = names
    return found


#: The settings a running supervisor keeps until it is restarted, by table.
RESTART_FIELDS: Mapping[str, tuple[str, ...]] = _restart_fields()
