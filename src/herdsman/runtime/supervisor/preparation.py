"""A run's preparation: everything between its recorded start and its process's spawn.

:class:`Preparation` owns what getting a run ready needs and keeps: each
provider's program resolved on PATH, each provider's and account's share of
a spec (:class:`~herdsman.runtime.launch.SpecBuilder`). Most runs are ready
at once (:meth:`Preparation.plain_spec`); a run with an orphaned agent of
its lanes to wait for, a moved conversation to note, a session to look up or
checkouts to make awaits them (:meth:`Preparation.spec_for`), which a cancel
may stop.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from operator import methodcaller

from herdsman.config import Config, Provider
from herdsman.core.accounts import Pick
from herdsman.runtime.launch import SpecBuilder
from herdsman.runtime.ledger import Ledger
from herdsman.runtime.orphan_watch import OrphanWatch
from herdsman.runtime.requests import run_request
from herdsman.runtime.runner import ProcessSpec
from herdsman.runtime.store import RunRecord
from herdsman.runtime.worktrees.manager import WorktreeManager, checkouts_preamble

__all__ = ["Preparation"]


def _resumes(record: RunRecord, provider: Provider) -> bool:
    """Whether the run resumes its conversation's session (looked up in the ledger first)."""
    return record.conversation is not None and bool(provider.resume_args)


def _account(name: str | None) -> str:
    return "the ambient environment" if name is None else f"account {name}"


class Preparation:
    """Gets runs ready: their process specs, their checkouts, their notes.

    ``worktrees`` is read at each run (a reload may make the first manager);
    ``orphans``: a fleet member's watch of its earlier process's agents;
    ``resolve_program`` finds a program on PATH.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        worktrees: Callable[[], WorktreeManager | None],
        orphans: OrphanWatch | None,
        resolve_program: Callable[[str], str | None],
    ) -> None:
        self._ledger = ledger
        self._worktrees = worktrees
        self._orphans = orphans
        self._resolve_program = resolve_program
        self._programs: dict[str, str] = {}
        # Each provider's and account's share of a spec, kept per configuration.
        self._specs = SpecBuilder(os.environ)

    def log_file(self, config: Config, run_id: str) -> str:
        """The run's log file under ``config``."""
        return self._specs.log_file(config, run_id)

    def forget_programs(self) -> None:
        """A reload: an exec may name another program now."""
        self._programs.clear()

    def prepares_slowly(self, record: RunRecord, pick: Pick | None, config: Config) -> bool:
        """Whether getting the run ready may await anything (see :meth:`spec_for`).

        Orphaned agents, a moved conversation's note, a session to look up,
        checkouts to make: only a run with none of these (most) is ready
        without a checkpoint.
        """
        if self._orphans is not None or (pick is not None and pick.moved):
            return True
        if record.conversation is None:
            return False  # neither a session to resume nor checkouts: both need one
        provider = config.providers.get(record.provider)
        return (provider is not None and _resumes(record, provider)) or self._checks_out(record)

    def _checks_out(self, record: RunRecord) -> bool:
        """Whether the run gets checkouts of the configured repositories (prepared first)."""
        worktrees = self._worktrees()
        return worktrees is not None and bool(worktrees.repos) and record.conversation is not None

    def _program(self, provider: Provider) -> str | None:
        """The provider's program, resolved on PATH (None: not found)."""
        program = self._programs.get(provider.exec[0])
        if program is None:
            # Resolved once and remembered: a PATH walk per run costs a stat
            # per folder. A program still missing is looked up again next run.
            program = self._resolve_program(provider.exec[0])
            if program is not None:
                self._programs[provider.exec[0]] = program
        return program

    def plain_spec(self, record: RunRecord, config: Config) -> ProcessSpec:
        """:meth:`spec_for` of a run that does not prepare slowly: it has nothing to await."""
        provider = config.providers.get(record.provider)
        if provider is None:
            raise OSError(f"provider {record.provider!r} is no longer configured")
        program = self._programs.get(provider.exec[0]) or self._program(provider)
        return self._specs.spec(record, config, program=program)

    async def spec_for(self, record: RunRecord, pick: Pick | None, config: Config) -> ProcessSpec:
        """Get the run ready, awaiting what it needs; its process's spec."""
        if self._orphans is not None:
            await self._orphans.clear_of(run_request(record))
        provider = config.providers.get(record.provider)
        if provider is None:
            raise OSError(f"provider {record.provider!r} is no longer configured")
        resume: list[str] = []
        conversation = record.conversation
        if pick is not None and pick.moved:
            text = (
                f"conversation moved from {_account(pick.moved_from)} to"
                f" {_account(pick.account)} (its account could not take the"
                " run): it starts a fresh session"
            )
            await self._ledger.call(methodcaller("add_note", record.id, text))
        if conversation is not None and _resumes(record, provider):
            session = await self._ledger.call(
                lambda s: s.conversation_session(record.provider, record.workspace, conversation)
            )
            # A session lives under the account that made it: elsewhere it
            # cannot be resumed, so the run starts a fresh one.
            if session is not None and session.account == record.account:
                resume = [
                    arg.replace("{session}", session.session_id) for arg in provider.resume_args
                ]
        program = self._program(provider)
        note, repos_dir = "", None
        worktrees = self._worktrees()
        if worktrees is not None and conversation is not None and self._checks_out(record):
            checkouts = await worktrees.prepare(record.workspace, conversation)
            note = checkouts_preamble(checkouts)
            for failed in (c for c in checkouts if not c.usable):
                text = (
                    f"repository {failed.repo.name} was read-only for this run: "
                    f"it could not be checked out ({failed.error})"
                )
                await self._ledger.call(methodcaller("add_note", record.id, text))
            if any(c.usable for c in checkouts):  # never a folder that was refused (a link)
                repos_dir = worktrees.folder(record.workspace, conversation)
        return self._specs.spec(
            record,
            config,
            resume=resume,
            program=program,
            checkouts_note=note,
            repos_dir=repos_dir,
        )
