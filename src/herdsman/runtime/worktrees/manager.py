"""Each conversation's own persistent checkout of every configured repository.

Layout: ``<root>/<conversation-slug>/<repo-name>``, where ``root`` is
``<state_dir>/worktrees``. A conversation's first run creates its worktrees;
later runs find them as the previous run left them.

Each worktree is on its own branch, ``herdsman/<slug>``, made at the source
repository's HEAD when the worktree is first made. A branch rather than a
detached HEAD because commits an agent makes there must outlive the worktree:
the sweeper removes only clean worktrees, and a clean worktree may still hold
commits that nothing else points at. The branch lives in the source
repository and is never deleted by herdsman; when a swept conversation comes
back, its worktree is made again on the same branch.

Nothing here ever raises for git trouble: a checkout that cannot be made is
returned with its reason, and the run goes on with that repository
read-only (see :func:`checkouts_preamble`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from herdsman.config import Repo
from herdsman.runtime.git import Git, GitError, NotARepository, WorktreeExists
from herdsman.runtime.state_paths import (
    LinkRefused,
    make_private_dirs,
    read_below,
    refuse_links,
    replace_below,
)
from herdsman.runtime.worktrees.slug import conversation_slug

log = logging.getLogger("herdsman.worktrees")

#: Written into each conversation's folder: who it belongs to and when a run last started.
METADATA = ".herdsman-conversation.json"
#: More than any metadata file herdsman writes: a bigger one is not read.
_METADATA_LIMIT = 64 << 10


@attrs.frozen
class Checkout:
    """One repository as one run sees it: its own worktree, or why there is none."""

    repo: Repo
    path: Path
    branch: str
    error: str | None = None

    @property
    def usable(self) -> bool:
        """Whether the worktree exists and the agent should work in it."""
        return self.error is None


@attrs.frozen
class ConversationFolder:
    """A conversation's folder of worktrees and what its metadata says."""

    path: Path
    workspace: str
    conversation: str
    last_used: float


class WorktreeManager:
    """Makes and finds the worktrees of conversations. ``wall`` gives unix seconds."""

    def __init__(
        self, git: Git, root: Path, repos: Sequence[Repo], *, wall: Callable[[], float]
    ) -> None:
        self.git = git
        self.root = root
        # The state directory: trusted as configured; nothing below it is
        # reached through a link (state_paths).
        self.anchor = root.parent
        self.repos = tuple(repos)
        # Repos a reload removed: no new worktrees of them, but those that
        # exist are still listed and swept like any other (by name).
        self.retired: dict[str, Repo] = {}
        self._wall = wall
        self._locks: dict[str, trio.Lock] = {}
        self._removing: dict[str, trio.Event] = {}
        # Each source repository's common git directory, by path: what a
        # reused worktree must belong to.
        self._git_dirs: dict[str, Path] = {}

    def set_repos(self, repos: Sequence[Repo]) -> None:
        """The repos runs get worktrees of from now on (a reload)."""
        current = {repo.name for repo in repos}
        for repo in self.repos:
            if repo.name not in current:
                self.retired[repo.name] = repo
        for name in current:
            self.retired.pop(name, None)
        self.repos = tuple(repos)

    @property
    def known_repos(self) -> tuple[Repo, ...]:
        """Configured repos, then removed ones whose worktrees may still exist."""
        return (*self.repos, *self.retired.values())

    @contextlib.contextmanager
    def removing(self, workspace: str, conversation: str) -> Iterator[None]:
        """Mark a removal of one of the conversation's worktrees as under way."""
        slug = conversation_slug(workspace, conversation)
        done = self._removing[slug] = trio.Event()
        try:
            yield
        finally:
            del self._removing[slug]
            done.set()

    def removal_under_way(self, workspace: str, conversation: str) -> bool:
        """Whether one of the conversation's worktrees is being removed now."""
        return conversation_slug(workspace, conversation) in self._removing

    async def removal_finished(self, workspace: str, conversation: str) -> None:
        """Return once no removal of the conversation's worktrees is under way."""
        done = self._removing.get(conversation_slug(workspace, conversation))
        if done is not None:
            await done.wait()

    def lock(self, workspace: str, conversation: str) -> trio.Lock:
        """The lock that preparing a run and sweeping share for one conversation."""
        slug = conversation_slug(workspace, conversation)
        lock = self._locks.get(slug)
        if lock is None:
            lock = self._locks[slug] = trio.Lock()
        return lock

    def folder(self, workspace: str, conversation: str) -> Path:
        """Where a conversation's worktrees live (it may not exist yet)."""
        return self.root / conversation_slug(workspace, conversation)

    async def prepare(self, workspace: str, conversation: str) -> list[Checkout]:
        """Make sure the conversation has a worktree of every repo; say which it has.

        Repositories are handled in parallel; the git port serialises work
        within one repository. The result is in the config's repo order.
        """
        folder = self.folder(workspace, conversation)
        slug = folder.name
        branch = branch_of(slug)
        results: dict[str, Checkout] = {}
        # The repos as they are now: a reload may change them while we wait.
        repos = self.repos

        async def one(repo: Repo) -> None:
            results[repo.name] = await self._checkout(repo, folder / repo.name, branch)

        # Waits for a sweep of this conversation to finish, then makes again
        # whatever it removed.
        async with self.lock(workspace, conversation):
            try:
                make_private_dirs(self.anchor, folder)
            except OSError as exc:  # a full disk, a link planted: every repo is read-only
                log.warning("no worktrees for %s: %s", folder.name, exc)
                return [
                    Checkout(repo, folder / repo.name, branch, error=str(exc)) for repo in repos
                ]
            self._touch(folder, workspace, conversation)
            async with trio.open_nursery() as nursery:
                for repo in repos:
                    nursery.start_soon(one, repo)
        return [results[repo.name] for repo in repos]

    async def _checkout(self, repo: Repo, path: Path, branch: str) -> Checkout:
        try:
            # Before git is given the path: git resolves links, and would
            # make (or reuse) a checkout wherever one points.
            refuse_links(self.anchor, path)
            if (path / ".git").exists():
                await self.check_owned(repo, path, branch)
                return Checkout(repo, path, branch)
            try:
                await self._add(repo, path, branch)
            except WorktreeExists:
                # Registered, but its folder was deleted by hand: drop that one
                # registration (never `git worktree prune`, which would also
                # drop the user's own worktrees that happen to be unmounted)
                # and make it again.
                if path.exists():
                    raise
                await self.git.remove_worktree(repo.path, path)
                await self._add(repo, path, branch)
        except (GitError, OSError) as exc:
            log.warning("no worktree of %s for %s: %s", repo.name, path.parent.name, exc)
            return Checkout(repo, path, branch, error=str(exc))
        log.info("made worktree %s of %s on %s", path, repo.path, branch)
        return Checkout(repo, path, branch)

    async def check_owned(self, repo: Repo, path: Path, branch: str) -> None:
        """Raise unless ``path`` is ``repo``'s worktree on ``branch``, reached through no link.

        The one ownership check: a run makes it before reusing a checkout,
        and the sweeper before removing one. Raises :class:`LinkRefused`
        (an ``OSError``) for a link at or above ``path`` below the state
        directory — a checkout an agent swapped for a link to, say, the
        user's own worktree — and :class:`GitError` for a folder that is
        not this repository's worktree on ``branch``: a source repository
        replaced by another at the same path (re-cloned, say) would
        otherwise leave a ``.git`` file pointing at whatever now answers to
        that name — possibly another conversation's worktree.
        """
        refuse_links(self.anchor, path)
        # One look at this worktree, not a listing of all the repository's:
        # a checkout per run must not cost more as conversations accumulate.
        try:
            head = await self.git.worktree_head(path)
        except NotARepository:
            head = None
        if head is not None and head.branch == branch:
            if head.git_dir == await self._git_dir(repo, fresh=False):
                return
            if head.git_dir == await self._git_dir(repo, fresh=True):
                return
        raise GitError(
            (
                "git",
                "-C",
                str(path),
                "rev-parse",
                "--git-common-dir",
                "--symbolic-full-name",
                "HEAD",
            ),
            f"{path} is not registered in {repo.path} on {branch} (was the repository "
            "replaced?); it is left as it is",
        )

    async def _git_dir(self, repo: Repo, *, fresh: bool) -> Path | None:
        """``repo``'s common git directory, remembered (looked up again if ``fresh``)."""
        key = os.fspath(repo.path)
        if fresh or key not in self._git_dirs:
            try:
                self._git_dirs[key] = (await self.git.worktree_head(repo.path)).git_dir
            except NotARepository:
                self._git_dirs.pop(key, None)
                return None
        return self._git_dirs[key]

    async def _add(self, repo: Repo, path: Path, branch: str) -> None:
        if await self.git.branch_exists(repo.path, branch):
            await self._forget_vanished_checkouts(repo, branch)
            await self.git.add_worktree_on(repo.path, path, branch=branch)
        else:
            head = await self.git.head(repo.path)
            await self.git.add_worktree(repo.path, path, branch=branch, commit=head)

    async def _forget_vanished_checkouts(self, repo: Repo, branch: str) -> None:
        """Drop registrations of our branch whose folder is gone (a moved state_dir).

        Only registrations on ``branch`` — ours — and only when their folder
        no longer exists: nothing of the user's is touched.
        """
        for entry in await self.git.list_worktrees(repo.path):
            if entry.branch == branch and not entry.path.exists():
                log.info("dropping the stale registration of %s in %s", entry.path, repo.path)
                await self.git.remove_worktree(repo.path, entry.path)

    def _touch(self, folder: Path, workspace: str, conversation: str) -> None:
        """Record the conversation's last use, which retention counts idleness from.

        Bookkeeping only: if it cannot be written (a full disk), the run
        still gets its checkouts, and the folder's idleness counts from the
        last use recorded before (a folder never recorded is never swept).
        """
        data = {"workspace": workspace, "conversation": conversation, "last_used": self._wall()}
        try:
            # A partial write (a full disk) is removed: it holds space.
            replace_below(self.anchor, folder / METADATA, json.dumps(data).encode("utf-8"))
        except OSError as exc:
            log.warning(
                "could not record the last use of %s (%s); the run goes on, and retention"
                " counts the folder idle since the last use recorded before",
                folder,
                exc,
            )

    def folders(self) -> list[ConversationFolder]:
        """Every conversation folder under the root that has readable metadata, by path.

        A link (at the root, at a folder or at its metadata) is no
        conversation folder: it is logged and left out, so nothing lists,
        sweeps or reuses what it points at.
        """
        found: list[ConversationFolder] = []
        try:
            refuse_links(self.anchor, self.root)
            entries = sorted(self.root.iterdir())
        except LinkRefused as exc:
            log.warning("worktrees: %s", exc)
            return found
        except OSError:  # no root yet
            return found
        for path in entries:
            if path.is_symlink():
                log.warning("worktrees: %s", LinkRefused(path))
                continue
            folder = self.folder_at(path)
            if folder is not None:
                found.append(folder)
        return found

    def folder_at(self, path: Path) -> ConversationFolder | None:
        """The conversation folder at ``path`` as its metadata says now, if readable.

        None too for a folder reached through a link, and for metadata
        naming a conversation whose folder is not this one (a copied file).
        """
        meta = self._read_metadata(path / METADATA)
        if meta is None or conversation_slug(meta["workspace"], meta["conversation"]) != path.name:
            return None
        return ConversationFolder(path, meta["workspace"], meta["conversation"], meta["last_used"])

    def _read_metadata(self, path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(read_below(self.anchor, path, limit=_METADATA_LIMIT))
        except (OSError, ValueError):
            return None
        return _valid_metadata(data)


def branch_of(slug: str) -> str:
    """The branch a conversation's worktrees are on."""
    return f"herdsman/{slug}"


def _valid_metadata(data: Any) -> dict[str, Any] | None:
    valid = (
        isinstance(data, dict)
        and isinstance(data.get("workspace"), str)
        and isinstance(data.get("conversation"), str)
        and isinstance(data.get("last_used"), int | float)
    )
    return data if valid else None


def checkouts_preamble(checkouts: Sequence[Checkout]) -> str:
    """What the agent is told about its checkouts, before the prompt."""
    if not checkouts:
        return ""
    lines = ["[herdsman] This conversation has its own checkouts of these repositories:"]
    for checkout in checkouts:
        if checkout.usable:
            lines.append(
                f"- {checkout.path} (branch {checkout.branch}) replaces {checkout.repo.path}"
            )
    unusable = [c for c in checkouts if not c.usable]
    if len(unusable) < len(checkouts):
        lines.append(
            "Do all repository work in these checkouts. Never switch branches, commit or "
            "edit files in the original repositories, and do not run `git worktree add` "
            "yourself."
        )
    for checkout in unusable:
        lines.append(
            f"- {checkout.repo.path} could not be checked out for you ({checkout.error}); "
            "treat it as read-only for this run."
        )
    return "\n".join(lines) + "\n\n"
