"""Reload: read the configuration again, put all of it in force or none, and say what changed.

:class:`Reloader` owns what a reload needs and nothing else: the file and
the configuration it last gave, one reload at a time, the generation
number, the last result and the settings waiting for a restart. What a
new configuration changes in the supervisor (its lifecycle's rules,
worktrees, programs, the trace header) is the supervisor's own business:
the reloader hands it the validated configuration (``apply``). The
retention loops sleep through :meth:`Reloader.sleep_until`, which a reload
cuts short so they read their settings again.

A reload is also how an operator says the accounts are logged in again
(docs/accounts.md): every reload that is applied — even of a file that did
not change, or one the last reload read already — frees the accounts that
needed a login; a rejected one frees none, as it changes nothing. A reload
that frees one is traced (as a ``reload`` event, its generation unchanged
when the configuration is), so a replay frees it at the same point.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import attrs
import trio

from herdsman.config import ConfigError, LoadedConfig
from herdsman.config.report import config_as_json
from herdsman.runtime.changes import Changes
from herdsman.runtime.config_watch import file_signature, watch_file
from herdsman.runtime.metrics import Metrics
from herdsman.runtime.reload import (
    Change,
    ConfigSource,
    ReloadResult,
    effective_config,
    given_config,
)

__all__ = ["Reloader"]

log = logging.getLogger("herdsman.supervisor")


class Reloader:
    """One reload at a time, from the file (``source``) or a configuration handed over whole.

    ``apply(loaded, now)`` puts a validated configuration with live changes
    in force in the supervisor (it may read the ledger first, and must not
    fail half way); ``logged_in()`` frees every account that needed a login
    and says whether there was one; ``emit`` traces an event now, ``emit_in_ledger_order``
    after every change already on its way to the ledger; ``changes`` is
    touched when a reload's result is known (the dashboard shows it).
    """

    def __init__(
        self,
        source: ConfigSource | None,
        loaded: LoadedConfig | None,
        *,
        wall: Callable[[], float],
        metrics: Metrics,
        apply: Callable[[LoadedConfig, float], Awaitable[None]],
        logged_in: Callable[[], bool],
        emit: Callable[..., None],
        emit_in_ledger_order: Callable[..., Awaitable[None]],
        changes: Changes,
    ) -> None:
        self._source = source
        self._loaded = loaded
        self._wall = wall
        self._metrics = metrics
        self._apply = apply
        self._logged_in = logged_in
        self._emit = emit
        self._emit_in_ledger_order = emit_in_ledger_order
        self._changes = changes
        self._lock = trio.Lock()
        self._reloaded = trio.Event()
        #: The configuration's generation: 1 at the start, one more each applied reload.
        self.generation = 1
        self.last_reload: ReloadResult | None = None
        #: Settings the file changed that apply only at the next start, as the
        #: last applied reload found them (a rejected reload changes nothing).
        self.waiting_for_restart: tuple[Change, ...] = ()
        # The file as the last reload (or the start) read it: the watcher
        # reloads only when it differs, whoever reloaded last.
        self._config_seen = file_signature(source.path) if source is not None else None
        metrics.config_generation.set(self.generation)

    @property
    def watches(self) -> bool:
        """Whether the file is to be watched (:meth:`watch`)."""
        return self._source is not None and self._source.watch

    async def watch(self) -> None:
        """Reload whenever the file's content changes (a task of the supervisor's nursery)."""
        assert self._source is not None
        path = self._source.path
        await watch_file(path, partial(self._config_changed, path))

    async def reload(self, trigger: str) -> ReloadResult:
        """Read the configuration file again and apply all of it, or none.

        One reload at a time; whatever triggered it (SIGHUP, the API, the
        file changing) gets the same result. Settings that cannot change
        live are reported and keep their running values.
        """
        async with self._lock:
            now = self._wall()
            if self._source is None or self._loaded is None:
                return self._rejected(
                    trigger, now, ["this supervisor was started without a file to reload"]
                )
            seen = file_signature(self._source.path)
            last = self.last_reload
            if seen is not None and seen == self._config_seen and last is not None:
                # This very file was reloaded already (the watcher is quick):
                # say what that reload did rather than "no changes", marked as
                # a repeat so nobody takes its changes for ones made now.
                log.info(
                    "reload (%s): the file is as the last reload (%s) found it: %s",
                    trigger,
                    last.trigger,
                    "applied" if last.ok else "rejected: " + "; ".join(last.errors),
                )
                if last.ok:
                    # Asked for again all the same: the operator logged an account in.
                    with trio.CancelScope(shield=True):
                        await self._log_in(self._loaded)
                return attrs.evolve(last, repeat=True)
            self._config_seen = seen
            try:
                loaded, changes = await trio.to_thread.run_sync(
                    effective_config, self._source, self._loaded
                )
            except ConfigError as error:
                return self._rejected(trigger, now, [str(p) for p in error.problems])
            except Exception as error:  # a bug in the loader must not stop the supervisor
                log.exception("reload (%s): reading the configuration failed", trigger)
                return self._rejected(
                    trigger, now, [f"{self._source.path}: could not be read: {error}"]
                )
            return await self._put_in_force(loaded, changes, trigger, now)

    async def reload_to(self, written: LoadedConfig, trigger: str) -> ReloadResult:
        """Apply a configuration handed over whole (the simulator's replayed reloads)."""
        async with self._lock:
            now = self._wall()
            if self._loaded is None:
                return self._rejected(trigger, now, ["no running configuration to compare with"])
            loaded, changes = given_config(written, self._loaded)
            return await self._put_in_force(loaded, changes, trigger, now)

    async def sleep_until(self, until: float) -> None:
        """Sleep until ``until`` (trio time), but wake early when a reload changes the settings."""
        reloaded = self._reloaded
        with trio.move_on_at(until):
            await reloaded.wait()

    async def _put_in_force(
        self, loaded: LoadedConfig, changes: list[Change], trigger: str, now: float
    ) -> ReloadResult:
        live = any(change.live for change in changes)
        if live:
            await self._apply(loaded, now)
            self._loaded = loaded
            self._reloaded.set()  # the retention loops look at their settings again
            self._reloaded = trio.Event()
            self.generation += 1
            self._metrics.config_generation.set(self.generation)
        # Shielded: once applied, a shutdown must not leave it untraced and unreported.
        with trio.CancelScope(shield=True):
            if not live:
                await self._log_in(loaded)
            result = await self._report(loaded, changes, trigger, now)
        # Returned outside: a cancel scope may swallow what is raised in it.
        return result  # noqa: RET504

    async def _report(
        self, loaded: LoadedConfig, changes: list[Change], trigger: str, now: float
    ) -> ReloadResult:
        result = ReloadResult(True, self.generation, trigger, now, tuple(changes))
        # Reported with the change itself, before its trace event waits for
        # the ledger: a status read meanwhile would otherwise show the new
        # generation and limits beside the previous reload's result.
        self.last_reload = result
        self.waiting_for_restart = tuple(change for change in changes if not change.live)
        self._changes.touch()
        self._metrics.last_reload_ok.set(1)
        self._metrics.last_reload_time.set(now)
        if any(change.live for change in changes):
            # The trace event goes in ledger order: starts decided before
            # the change were queued before this, starts decided after it
            # after, so each start shows under the configuration it was
            # decided with (starts are traced when committed).
            as_json = config_as_json(loaded.config)
            await self._emit_in_ledger_order("reload", generation=self.generation, config=as_json)
        if not changes:
            log.info("reload (%s): no changes", trigger)
        for change in changes:
            log.info("reload (%s): %s", trigger, change.describe())
        return result

    async def _log_in(self, loaded: LoadedConfig) -> None:
        """An applied reload that changed nothing live: free the accounts that needed a login.

        Traced as a reload that keeps the generation, so a replay frees them
        at the same point (an applied live change frees them as part of its
        own ``reload``: the lifecycle's reconfiguration logs every account in).
        """
        if self._logged_in():
            as_json = config_as_json(loaded.config)
            await self._emit_in_ledger_order("reload", generation=self.generation, config=as_json)

    def _rejected(self, trigger: str, now: float, errors: list[str]) -> ReloadResult:
        result = ReloadResult(False, self.generation, trigger, now, errors=tuple(errors))
        self.last_reload = result
        self._metrics.last_reload_ok.set(0)
        self._metrics.last_reload_time.set(now)
        log.error("reload (%s) rejected; nothing changed:", trigger)
        for error in errors:
            log.error("  %s", error)
        self._emit("reload_rejected", errors=errors)
        self._changes.touch()
        return result

    async def _config_changed(self, path: Path) -> None:
        """The file may have changed (the watcher says): reload if its content did."""
        # Another trigger may have reloaded this very content meanwhile, and
        # a moment without a file (mid-rename) is no reason to reload.
        current = file_signature(path)
        if current is not None and current != self._config_seen:
            try:
                await self.reload("file changed")
            except Exception:  # the watcher outlives anything one reload does
                log.exception("reload after a change of %s failed", path)
