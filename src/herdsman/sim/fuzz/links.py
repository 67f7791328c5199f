"""Faults made of symbolic links: what an agent, running as the user, can do to the state dir.

Two faults (``Scenario.events``):

* ``swap_checkout`` — an agent replaces its conversation's clean checkout of
  ``repo`` by a link to the user's own worktree of that repository (made at
  the start, outside the state dir, registered in git like any worktree).
  Swept through the link, git would remove the user's worktree.
* ``plant_link`` — a link to a folder outside the state dir is planted where
  a conversation's folder would be made. Followed, the conversation's next
  run would make its checkouts and metadata out there.

Each is a no-op when there is nothing to do it to (no clean checkout to swap,
or a folder already there), so the minimiser may drop any event around it.
The invariant they exercise: nothing outside the state dir is touched.
:func:`snapshot` records what is in the folders outside it (the user's
worktrees and the links' targets), and the checker compares it after every
event with what the faults themselves left there
(:meth:`~herdsman.sim.fuzz.invariants.Checker.untouched`).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from herdsman.config import Repo
from herdsman.runtime.git import GitError
from herdsman.runtime.git.fake import FakeGit
from herdsman.runtime.worktrees.slug import conversation_slug
from herdsman.sim.fuzz.invariants import Checker, snapshot

__all__ = ["LINK_FAULTS", "OUTSIDE", "USER_WORKTREES", "LinkFaults"]

#: The fault kinds this module carries out.
LINK_FAULTS = frozenset({"swap_checkout", "plant_link"})
#: Folders outside the state dir: what the links point at.
OUTSIDE = Path("/herdsman-sim/outside")
USER_WORKTREES = Path("/herdsman-sim/user")


class LinkFaults:
    """Carries out the link faults on the fake filesystem, and checks the outside is intact.

    Its own :class:`FakeGit`, with no
    latency and no injected failures, sets up and inspects: the fake git
    keeps all its state on the filesystem, so it sees what the
    supervisor's sees, and the scenario's git faults stay for the supervisor.
    """

    def __init__(self) -> None:
        self._worktrees = Path()
        self._git = FakeGit()
        self._expected: Mapping[str, str] = {}

    async def prepare(self, state_dir: Path, repos: Sequence[Repo]) -> None:
        """Give the user a worktree of each repository, outside ``state_dir`` (the
        supervisor's), on a branch of its own."""
        self._worktrees = state_dir / "worktrees"
        OUTSIDE.mkdir(parents=True, exist_ok=True)
        for repo in repos:
            path = USER_WORKTREES / repo.name
            await self._git.add_worktree(repo.path, path, branch=f"user/{repo.name}", commit="HEAD")
        self._expected = self._outside()

    async def apply(self, event: Mapping[str, Any]) -> None:
        """Carry out one link fault, if there is something to do it to."""
        slug = conversation_slug(event["workspace"], event["conversation"])
        folder = self._worktrees / slug
        # On a full disk the agent gets as far as it can, as a real one would.
        with contextlib.suppress(OSError):
            if event["kind"] == "swap_checkout":
                await self._swap(folder / event["repo"], USER_WORKTREES / event["repo"])
            elif not folder.exists() and not folder.is_symlink():
                target = OUTSIDE / slug
                target.mkdir(exist_ok=True)
                folder.parent.mkdir(parents=True, exist_ok=True)
                folder.symlink_to(target)
        self._expected = self._outside()

    async def _swap(self, checkout: Path, user: Path) -> None:
        if checkout.is_symlink() or not checkout.is_dir() or not user.is_dir():
            return
        try:
            state = await self._git.worktree_status(checkout)
        except GitError:
            return
        if state.clean:  # an agent's own work is never what it throws away here
            shutil.rmtree(checkout)
            checkout.symlink_to(user)

    def check(self, checker: Checker) -> None:
        """After an event: a violation if anything outside the state dir changed."""
        checker.untouched(self._expected, self._outside())

    @staticmethod
    def _outside() -> dict[str, str]:
        return {**snapshot(OUTSIDE), **snapshot(USER_WORKTREES)}
