"""``herdsman run``: one trio nursery owning the supervisor, the API and signals."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import logging
import os
import secrets
import signal
import socket
from functools import partial
from pathlib import Path
from typing import TypeVar

import attrs
import trio

from herdsman.config import Config, LoadedConfig
from herdsman.postgres_url import parse_postgres_url, server_name
from herdsman.runtime.api.app import create_app
from herdsman.runtime.api.server import ensure_token, serve_api
from herdsman.runtime.dashboard.app import with_dashboard
from herdsman.runtime.fence import Fence, wait_for_earlier_keepers
from herdsman.runtime.fleet_member import FleetMember
from herdsman.runtime.lockfile import StateDirLock
from herdsman.runtime.pointer import remove_pointer, write_pointer
from herdsman.runtime.reload import ConfigSource
from herdsman.runtime.sole_fence import SoleFence
from herdsman.runtime.state_paths import make_private_dirs
from herdsman.runtime.store import SqliteStore, Store, StoreError
from herdsman.runtime.supervisor import ShutdownReport, Supervisor
from herdsman.trace import TraceWriter

log = logging.getLogger("herdsman")
E = TypeVar("E", bound=BaseException)

DB_NAME = "herdsman.db"


def token_path(config: Config) -> Path:
    """Where the API's bearer token lives."""
    return config.api.token_file


def config_for_trace(config: Config) -> dict[str, object]:
    """The effective config as the trace header records it (JSON-safe)."""
    from herdsman.config.report import config_as_json  # noqa: PLC0415 - heavy, only here

    return config_as_json(config)


def open_store(config: Config) -> Store:
    """The run ledger the config names: PostgreSQL at ``[store] url``, else SQLite in state_dir.

    With ``[fleet] enabled``, the PostgreSQL ledger is joined as a fleet
    member (a :class:`FleetStore`) rather than held alone. Blocking (it
    connects, or opens a file, and migrates): call it in a worker thread.
    """
    if config.fleet.enabled:
        assert config.store.url is not None  # validation requires it
        from herdsman.runtime.store.fleet import FleetStore  # noqa: PLC0415

        return FleetStore(
            config.store.url,
            member_id=new_member_id(),
            host=socket.gethostname(),
            pid=os.getpid(),
            lease=config.fleet.lease.total_seconds(),
        )
    if config.store.url is not None:
        # Imported only when used: psycopg is slow to import.
        from herdsman.runtime.store.postgres import PostgresStore  # noqa: PLC0415

        return PostgresStore(config.store.url, sole=True)
    return SqliteStore(config.supervisor.state_dir / DB_NAME)


def new_member_id() -> str:
    """A fleet member id, new at every start: a restarted supervisor is a new member."""
    return secrets.token_hex(8)


def ledger_name(config: Config) -> str:
    """Where the run ledger is, for the log: the server and database, or the file."""
    if config.store.url is not None:
        return server_name(parse_postgres_url(config.store.url))
    return str(config.supervisor.state_dir / DB_NAME)


@attrs.frozen
class Serving:
    """What ``serve`` reports once the API answers: its URLs and the supervisor."""

    urls: tuple[str, ...]
    supervisor: Supervisor


async def serve(
    config: Config,
    *,
    handle_signals: bool = True,
    source: ConfigSource | None = None,
    loaded: LoadedConfig | None = None,
    task_status: trio.TaskStatus[Serving] = trio.TASK_STATUS_IGNORED,
) -> ShutdownReport:
    """Run the supervisor until a shutdown signal; return how it stopped.

    The state-directory lock must already be held by the caller. Signals
    (SIGINT/SIGTERM: drain, then cancel; SIGHUP: reload) are handled when
    ``handle_signals``; tests call ``Serving.supervisor.request_shutdown()``
    instead. With a ``source`` (and ``loaded``, what it gave) the
    configuration can be reloaded.
    """
    state_dir = config.supervisor.state_dir
    # Private by default: the ledger holds prompts and the API token.
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Never through a link planted there; an older herdsman's 0755 made 0700.
    make_private_dirs(state_dir, state_dir / "logs")
    if config.trace.enabled and config.trace.dir.is_relative_to(state_dir):
        make_private_dirs(state_dir, config.trace.dir)
    # Nothing of ours may run before a dead predecessor's keeper is done.
    await wait_for_earlier_keepers(state_dir)
    store = await trio.to_thread.run_sync(open_store, config)
    trace = None
    if config.trace.enabled:
        trace = TraceWriter(
            config.trace.dir,
            max_bytes=config.trace.max_bytes,
            config=config_for_trace(config),
            clock=trio.current_time,
            wall=lambda: dt.datetime.now(dt.UTC),
        )
    try:
        fleet, sole = await _fence(config, store)
    except BaseException:
        store.close()
        raise
    supervisor = Supervisor(config, store, trace=trace, source=source, loaded=loaded, fleet=fleet)
    token = ensure_token(token_path(config))
    try:
        if trace is not None:
            trace.open()  # an unusable trace folder fails the start, not a run
        async with trio.open_nursery() as outer:
            # Signals are watched until everything below has stopped, so a
            # late Ctrl-C is still a shutdown request, never a traceback.
            if handle_signals:
                outer.start_soon(_watch_signals, supervisor)
            if sole is not None:
                outer.start_soon(sole.keep)
            report = await _serve_api_and_supervisor(supervisor, token, source, task_status)
            outer.cancel_scope.cancel()
    finally:
        if trace is not None:
            trace.close()
        if fleet is not None:
            # First the agents go (any left), then the lease: leaving waives
            # the margin the other members give the fence.
            assert fleet.fence is not None
            await fleet.fence.close()
            with contextlib.suppress(StoreError):  # its lease then lapses by itself
                fleet.store.leave()
        if sole is not None:
            # Only now: the supervisor is done with its agents (drained, or stopped).
            await sole.close()
        store.close()
    return report


async def _fence(config: Config, store: Store) -> tuple[FleetMember | None, SoleFence | None]:
    """The keeper of this supervisor's agents, started before anything can spawn.

    A fleet member's agents never outlive its lease; a sole supervisor's
    never outlive the supervisor.
    """
    state_dir = config.supervisor.state_dir
    if config.fleet.enabled:
        from herdsman.runtime.store.fleet import FleetStore  # noqa: PLC0415

        assert isinstance(store, FleetStore)
        fence = await Fence.start(state_dir, store.lease_end_local)
        return FleetMember(store, fence), None
    return None, await SoleFence.start(state_dir)


async def _serve_api_and_supervisor(
    supervisor: Supervisor,
    token: str,
    source: ConfigSource | None,
    task_status: trio.TaskStatus[Serving],
) -> ShutdownReport:
    config = supervisor.config
    api_stopped = trio.Event()
    async with trio.open_nursery() as nursery:
        # The API binds first: if its address is taken, nothing has started.
        # Its requests wait for recovery inside the supervisor, so no new
        # submit can get ahead of the runs queued before a restart.
        urls = await nursery.start(
            partial(
                serve_api,
                with_dashboard(create_app(supervisor, token), supervisor, token),
                config.api.listen,
                shutdown_trigger=api_stopped.wait,
            )
        )
        await nursery.start(supervisor.run)
        log.info(
            "herdsman is running; API on %s; state in %s; ledger: %s",
            ", ".join(urls),
            config.supervisor.state_dir,
            ledger_name(config),
        )
        # Where the CLI finds this supervisor even after an edit of the file
        # moved its address (applied at the next start) or broke the file.
        pointer = None
        if source is not None:
            pointer = write_pointer(source.path, urls[0], config.api.token_file)
        try:
            task_status.started(Serving(tuple(urls), supervisor))
            await supervisor.finished.wait()
        finally:
            remove_pointer(pointer)
        api_stopped.set()
    assert supervisor.report is not None
    return supervisor.report


async def _watch_signals(supervisor: Supervisor) -> None:
    async with trio.open_nursery() as reloads:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    # In its own task: a shutdown signal right after must not wait.
                    reloads.start_soon(supervisor.reload, "SIGHUP")
                    continue
                _shutdown_signal(supervisor, signum)


def _shutdown_signal(supervisor: Supervisor, signum: int) -> None:
    if supervisor.admitting:
        log.info("%s: draining (send it again to cancel running runs)", signal.Signals(signum).name)
    else:
        log.info("%s: cancelling running runs", signal.Signals(signum).name)
    supervisor.request_shutdown()


class StartFailed(Exception):
    """The supervisor could not start (the API address is taken, say)."""


def _leaves(group: BaseExceptionGroup[E]) -> list[E]:
    out: list[E] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def run_supervisor(
    config: Config, *, source: ConfigSource | None = None, loaded: LoadedConfig | None = None
) -> int:
    """Take the state-directory lock and serve; the exit code says how it went.

    Raises :class:`StartFailed` with a one-line reason when the API cannot
    listen or the state directory cannot be used.
    """
    failure: OSError | None = None
    ledger_failure: StoreError | None = None
    with StateDirLock(config.supervisor.state_dir):
        try:
            report = trio.run(partial(serve, config, source=source, loaded=loaded))
        except* OSError as group:  # trio reports task errors in exception groups
            failure = _leaves(group)[0]
        except* StoreError as group:  # a corrupt or too new ledger, an unreachable server
            ledger_failure = _leaves(group)[0]
    if ledger_failure is not None:
        raise StartFailed(str(ledger_failure))
    if failure is not None:
        if failure.errno == errno.EADDRINUSE:
            raise StartFailed(
                f"cannot listen on {config.api.listen}: the address is in use "
                "(another supervisor or program?); choose another with api.listen"
            )
        raise StartFailed(f"cannot start: {failure}")
    if report.fatal is not None:
        log.error("stopped because %s", report.fatal)
        return 4
    if report.drained:
        log.info("stopped cleanly")
        return 0
    log.warning("stopped after cancelling %d running run(s)", len(report.cancelled))
    return 3
