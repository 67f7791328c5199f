"""Reloading supervisor.toml: read it again, validate, and say what changed.

A reload applies all of a valid file or none of an invalid one. A few keys
cannot change under a running supervisor (where its ledger lives, the
address it listens on, where its trace goes): a change to one of them is
reported as needing a restart and the running value is kept — never
silently ignored, never half applied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from herdsman.config import Config, LoadedConfig, load_config
from herdsman.config.model import RESTART_FIELDS
from herdsman.config.render import inline_toml

__all__ = [
    "RESTART_KEYS",
    "Change",
    "ConfigSource",
    "ReloadResult",
    "change_line",
    "diff_settings",
    "effective_config",
    "given_config",
]

#: Settings a running supervisor cannot take over; they apply at the next start
#: (the fields declared ``restart=True`` in the configuration model).
RESTART_KEYS: tuple[str, ...] = tuple(
    f"{table}.{name}" for table, names in RESTART_FIELDS.items() for name in names
)


@attrs.frozen
class ConfigSource:
    """Where a supervisor's configuration comes from, to read it again the same way.

    ``watch``: reload when the file changes (``herdsman run`` always does).
    """

    path: Path
    overrides: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    environ: Mapping[str, str] | None = None
    watch: bool = True

    def load(self, extra_overrides: Sequence[str] = ()) -> LoadedConfig:
        """Read and validate the file (raises ``ConfigError``)."""
        return load_config(self.path, (*self.overrides, *extra_overrides), environ=self.environ)


@attrs.frozen
class Change:
    """One setting that differs between the running and the new configuration.

    ``kind`` is ``changed`` for one setting, or ``added``/``removed`` for a
    whole provider, account or repo (``key`` then names it, such as
    ``providers.echo`` or ``repos[app]``): one line however many settings
    it holds.
    """

    key: str
    old: Any
    new: Any
    live: bool
    kind: str = "changed"

    def describe(self) -> str:
        """``providers.demo.concurrency: 2 -> 4 (applied)`` or ``providers.echo: added (applied)``.

        The supervisor logs it; the CLI prints the same from the JSON answer.
        """
        shown = self.as_json()
        return change_line(self.key, self.kind, shown["old"], shown["new"], self.live, gap=" ")

    def as_json(self) -> dict[str, Any]:
        """The change as JSON (values in their TOML form, environment values hidden)."""
        if self.kind == "changed":
            old, new = _shown(self.key, self.old), _shown(self.key, self.new)
        else:
            # A whole table: its settings are the new file's (or were the old one's).
            old = "(not set)" if self.kind == "added" else "(table)"
            new = "(table)" if self.kind == "added" else "(not set)"
        return {"key": self.key, "change": self.kind, "old": old, "new": new, "applied": self.live}


def change_line(key: str, kind: str, old: str, new: str, applied: bool, *, gap: str = "  ") -> str:
    """A change as one line, from its JSON fields (the CLI prints the API's answer with it)."""
    what = "applied" if applied else "needs a restart; the running value is kept"
    if kind != "changed":
        return f"{key}: {kind}{gap}({what})"
    return f"{key}: {old} -> {new}{gap}({what})"


def _shown(key: str, value: Any) -> str:
    if value is None:
        return "(not set)"
    if key.endswith(".env") and isinstance(value, Mapping):
        # Environment values are often credentials: logs and answers show
        # which variables changed, never their values.
        value = dict.fromkeys(value, "***")
    return inline_toml(value)


_ELEMENT = re.compile(r"^(?P<array>.*?\b(?:accounts|repos))\[(?P<index>\d+)\]\.")


def by_name(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with array elements keyed by their name, not their place.

    ``providers.claude.accounts[0].budget`` becomes
    ``providers.claude.accounts[work].budget``, so removing the first of two
    accounts reads as that account gone, not as the second renamed.
    """
    out: dict[str, Any] = {}
    for key, value in values.items():
        named = key
        found = _ELEMENT.match(key)
        if found is not None:
            name = values.get(f"{found['array']}[{found['index']}].name")
            if isinstance(name, str):
                named = f"{found['array']}[{name}].{key[found.end() :]}"
        out[named] = value
    return out


_OWNERS = re.compile(
    r"^(?P<provider>providers\.[^.\[]+)(?:\.(?P<account>accounts\[[^\]]*\]))?"
    r"|^(?P<repo>repos\[[^\]]*\])"
)


def _owners(key: str) -> tuple[str, ...]:
    """The tables ``key`` lies in that can come and go whole, outermost first."""
    found = _OWNERS.match(key)
    if found is None:
        return ()
    if found["repo"] is not None:
        return (found["repo"],)
    provider = found["provider"]
    if found["account"] is not None:
        return (provider, f"{provider}.{found['account']}")
    return (provider,)


def diff_settings(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """Settings that differ, keyed like ``LoadedConfig.toml_values``.

    Accounts and repos are matched by name (see :func:`by_name`). A provider,
    account or repo that is new or gone is one change naming it, not one per
    setting in it. New keys in the new file's order, then keys that are gone,
    in the old order (an account or a repo removed, a provider dropped).
    """
    old, new = by_name(old), by_name(new)
    old_owners = {owner for key in old for owner in _owners(key)}
    new_owners = {owner for key in new for owner in _owners(key)}
    changes: list[Change] = []
    reported: set[str] = set()

    def whole(key: str, missing: set[str]) -> str | None:
        # The outermost table around ``key`` that only one side has.
        return next((owner for owner in _owners(key) if owner not in missing), None)

    for key, value in new.items():
        added = whole(key, old_owners)
        if added is not None:
            if added not in reported:
                reported.add(added)
                changes.append(Change(added, None, None, True, "added"))
        # A key that is new but unset (a new table's optional keys) is no change.
        elif old.get(key) != value:
            changes.append(Change(key, old.get(key), value, key not in RESTART_KEYS))
    for key, value in old.items():
        if key in new:
            continue
        removed = whole(key, new_owners)
        if removed is not None:
            if removed not in reported:
                reported.add(removed)
                changes.append(Change(removed, None, None, True, "removed"))
        elif value is not None:
            changes.append(Change(key, value, None, True))
    return changes


def effective_config(
    source: ConfigSource, running: LoadedConfig
) -> tuple[LoadedConfig, list[Change]]:
    """The configuration a reload applies, and every change with what became of it.

    The new file is loaded twice when ``state_dir`` changed: once as written
    (to report the change), once with the running ``state_dir``, so settings
    whose defaults derive from it (``workdir``, ``token_file``, the trace
    folder) stay where they are until the restart that moves them all.
    """
    written = source.load()
    restart = [
        change
        for change in diff_settings(running.toml_values, written.toml_values)
        if not change.live
    ]
    loaded = written
    old_state_dir = running.config.supervisor.state_dir
    if written.config.supervisor.state_dir != old_state_dir:
        loaded = source.load([f"supervisor.state_dir={inline_toml(str(old_state_dir))}"])
    config = _keep_restart_settings(loaded.config, running.config)
    live = [c for c in diff_settings(running.toml_values, loaded.toml_values) if c.live]
    # The running values of restart-only keys stay the baseline, so the next
    # reload still reports them as waiting for a restart.
    toml_values = dict(loaded.toml_values)
    for key in RESTART_KEYS:
        if key in running.toml_values:
            toml_values[key] = running.toml_values[key]
    kept = attrs.evolve(loaded, config=config, toml_values=toml_values)
    return kept, live + restart


def given_config(written: LoadedConfig, running: LoadedConfig) -> tuple[LoadedConfig, list[Change]]:
    """Like :func:`effective_config`, for a configuration handed over whole.

    The simulator replays a trace's reload events this way. Restart-only
    settings keep their running values; there is no file to load again, so
    defaults that derive from a changed ``state_dir`` are taken as written.
    """
    changes = diff_settings(running.toml_values, written.toml_values)
    config = _keep_restart_settings(written.config, running.config)
    return attrs.evolve(written, config=config), changes


def _keep_restart_settings(new: Config, old: Config) -> Config:
    """``new`` with the running values of every restart-only setting."""
    kept = {
        table: attrs.evolve(
            getattr(new, table), **{name: getattr(getattr(old, table), name) for name in names}
        )
        for table, names in RESTART_FIELDS.items()
    }
    return attrs.evolve(new, **kept)


@attrs.frozen
class ReloadResult:
    """How one reload went."""

    ok: bool
    #: The configuration generation in force afterwards.
    generation: int
    trigger: str
    at: float
    changes: tuple[Change, ...] = ()
    #: One line per problem, as ``herdsman check`` prints them, if rejected.
    errors: tuple[str, ...] = ()
    #: True when the file was as an earlier reload found it: this is that
    #: reload's result (its trigger, time and changes), and nothing was done now.
    repeat: bool = False

    @property
    def applied(self) -> bool:
        """Whether something changed live (and the generation moved on)."""
        return self.ok and any(change.live for change in self.changes)

    def as_json(self) -> dict[str, Any]:
        """The result as the API and ``herdsman status`` show it."""
        return {
            "ok": self.ok,
            "generation": self.generation,
            "trigger": self.trigger,
            "at": self.at,
            "changes": [change.as_json() for change in self.changes],
            "errors": list(self.errors),
            "repeat": self.repeat,
        }
