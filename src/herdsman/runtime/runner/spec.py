"""What to run (``ProcessSpec``) and how it ended (``ProcessOutcome``)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

import attrs

# Defined in the core, where the lifecycle decides with them; re-exported here.
from herdsman.core.outcome import Outcome as Outcome  # noqa: PLC0414
from herdsman.core.outcome import UsageLimit as UsageLimit  # noqa: PLC0414
from herdsman.runtime.runner.run_usage import RunUsage

PROTOCOLS: tuple[str, ...] = ("plain", "claude", "codex")
"""The output protocols the runner understands (see the ``protocols`` package)."""


def _argv(argv: Iterable[str]) -> tuple[str, ...]:
    if isinstance(argv, str):  # tuple("claude") would run "c" with arguments "l", "a", ...
        raise TypeError("argv must be a sequence of strings, not one string")
    return tuple(argv)


def _path(value: str | os.PathLike[str]) -> Path:
    return value if isinstance(value, Path) else Path(value)


def _str_path(value: str | os.PathLike[str]) -> str:
    return value if type(value) is str else os.fspath(value)


class OwnedEnv(dict[str, str]):
    """An environment a :class:`ProcessSpec` takes over as it is, without a copy.

    Whoever builds one hands it over for good: it must neither keep it nor
    change it after the spec is made. (Any other mapping is copied.)
    """

    __slots__ = ()


def _frozen_env(env: Mapping[str, str]) -> Mapping[str, str]:
    # A snapshot: the caller may keep mutating its own dict (os.environ, say)
    # after building the spec; the run must see what was there at build time.
    # An OwnedEnv is made for this spec alone: a second copy per run is waste.
    return MappingProxyType(env if type(env) is OwnedEnv else dict(env))


def _positive_or_none(
    _: object, attribute: attrs.Attribute[float | None], value: float | None
) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{attribute.name} must be positive or None, not {value!r}")


def _non_negative(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{attribute.name} must be >= 0, not {value!r}")


def _non_empty(
    _: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must name a program")


def _valid_pattern(_: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is None:
        return
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{attribute.name} is not a valid regular expression: {exc}") from None


# Frozen, but not slotted: a frozen slotted class stores each field through
# object.__setattr__, a call per field; without slots each goes straight
# into the instance's __dict__ (store/records.py, ``NewRun``, measured it).
# One spec is built per run started.
@attrs.frozen(slots=False)
class ProcessSpec:
    """One agent process to run, completely described.

    ``argv`` is executed directly (no shell); a bare ``argv[0]`` is looked up on
    the ``PATH`` of ``env``. ``env`` is the child's *complete* environment:
    nothing is inherited from herdsman. ``prompt`` reaches the child on stdin
    only, never through argv or the environment, so it never shows up in
    ``ps`` or ``/proc/<pid>/cmdline``.

    ``timeout`` bounds the wall-clock time from spawn; ``idle_timeout`` bounds
    the time without a single byte on stdout or stderr. ``kill_grace`` is the
    delay between SIGTERM and SIGKILL when the process group is stopped.
    ``usage_limit_pattern`` (a regex) lets the ``plain`` protocol recognise a
    usage-limit message on stdout or stderr; a named group ``resets_at`` holding
    unix seconds is taken as the reset time. ``make_cwd`` creates ``cwd`` if
    it is missing. ``log_path`` (kept as the string ``log_file``) is the
    file the output is written to.
    """

    argv: tuple[str, ...] = attrs.field(converter=_argv, validator=_non_empty)
    env: Mapping[str, str] = attrs.field(converter=_frozen_env, hash=False)
    cwd: Path = attrs.field(converter=_path)
    prompt: str
    timeout: float | None = attrs.field(validator=_positive_or_none)
    idle_timeout: float | None = attrs.field(validator=_positive_or_none)
    #: Where the output goes, as given (a string is kept as it is: a ``Path``
    #: built per run costs more than the rest of the spec's fields together).
    #: Passed as ``log_path``; :attr:`log_path` is the same as a ``Path``.
    log_file: str = attrs.field(converter=_str_path, alias="log_path")
    protocol: str = attrs.field(validator=attrs.validators.in_(PROTOCOLS))
    kill_grace: float = attrs.field(default=5.0, validator=_non_negative)
    usage_limit_pattern: str | None = attrs.field(default=None, validator=_valid_pattern)
    #: Create ``cwd`` (and its parents) if it is missing: right for a folder
    #: herdsman owns (a provider's workdir), wrong for one a client named.
    make_cwd: bool = False

    @property
    def log_path(self) -> Path:
        """:attr:`log_file` as a ``Path``."""
        return Path(self.log_file)


@attrs.frozen
class ProcessOutcome:
    """How one process run ended, with what it produced.

    ``exit_code`` is the return code as Python reports it (negative: killed by
    that signal), or None if no process was started. ``reason`` explains any
    status but ``succeeded``; ``limit`` names the limit that fired
    (``"timeout"`` or ``"idle_timeout"``) for ``timed_out``. ``result`` is the
    agent's reply and is only set when the process ended by itself.
    ``excerpt`` is at most 4 KiB of the combined output (see ``excerpt.py``).
    ``usage`` is what the run spent and what its provider said, as read from
    the agent's stream (``run_usage.py``), for runs stopped early too; None
    when the stream said nothing of it. It has no part in the status.
    ``worked``: the agent may have done some of its work (it called a tool,
    finished a turn; a plain CLI printed anything), which only some failure
    classes retry.
    """

    status: Outcome
    exit_code: int | None
    reason: str | None
    limit: str | None
    result: str | None
    session_id: str | None
    excerpt: str
    usage_limit: UsageLimit | None
    usage: RunUsage | None = None
    worked: bool = False


def not_started(status: Outcome, reason: str | None) -> ProcessOutcome:
    """The outcome of a run that ended before a process was spawned for it."""
    return ProcessOutcome(
        status=status,
        exit_code=None,
        reason=reason,
        limit=None,
        result=None,
        session_id=None,
        excerpt="",
        usage_limit=None,
    )
