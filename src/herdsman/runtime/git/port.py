"""The git port: the few git operations the worktree manager and sweeper need.

Everything herdsman does to a repository goes through :class:`Git`. Production
uses :class:`~herdsman.runtime.git.real.RealGit` (the ``git`` binary, run with
trio); the simulator uses :class:`~herdsman.runtime.git.fake.FakeGit` (plain
file operations on whatever filesystem is active, so pyfakefs works). One
contract suite (``tests/integration/git/test_git_contract.py``) runs against
both, which is what makes the fake trustworthy.

Paths: every method takes :class:`pathlib.Path`. A relative path is taken
relative to the process's working directory. Paths are compared after
resolving symlinks, and paths that come back (``WorktreeEntry.path``) are
resolved, as git itself reports them. A ``repo`` argument is the top directory
of a non-bare repository's main working tree; a subdirectory of a repository
is *not* a repository here (unlike plain ``git -C``, which searches upwards).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import attrs


@attrs.frozen
class WorktreeState:
    """What ``git status --porcelain=v1 -z --untracked-files=all`` says about a worktree.

    ``clean`` is True only for an existing worktree with nothing to report;
    a missing directory is ``exists=False, clean=False`` so that a caller
    deciding "safe to delete?" never mistakes "not there" for "verified clean".
    ``modified`` holds every tracked path with a change (staged or not,
    including deletions and renames); ``untracked`` every untracked file, one
    entry per file (never a directory). Ignored files appear in neither. Both
    tuples are sorted.
    """

    exists: bool
    clean: bool
    modified: tuple[str, ...] = ()
    untracked: tuple[str, ...] = ()


MISSING = WorktreeState(exists=False, clean=False)
"""The state of a worktree whose directory does not exist."""


@attrs.frozen
class WorktreeEntry:
    """One linked worktree as ``git worktree list --porcelain`` reports it.

    ``branch`` is the short branch name (``refs/heads/`` stripped), or None
    when the worktree is on a detached HEAD. ``prunable`` means git considers
    the registration stale (its directory, or the directory's ``.git`` file,
    is gone); :meth:`Git.prune` would drop it.
    """

    path: Path
    head: str
    branch: str | None
    prunable: bool


@attrs.frozen
class WorktreeHead:
    """Whose working tree a directory is, and what it has checked out.

    ``git_dir`` is the repository's common git directory (``<repo>/.git``
    usually; elsewhere for a ``--separate-git-dir`` repository): the same
    for a repository's main working tree and all its linked worktrees.
    ``branch`` is the short name of the branch checked out, or None on a
    detached HEAD.
    """

    git_dir: Path
    branch: str | None


def first_line(stderr: str) -> str:
    """The line of git's stderr worth quoting: the first ``fatal:``/``error:`` line.

    git sometimes prints progress ("Preparing worktree ...") before the reason
    it failed; the reason is what a reader needs, so it wins when present.
    """
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith(("fatal:", "error:")):
            return line
    return lines[0] if lines else "(no output on stderr)"


class GitError(Exception):
    """A git operation failed.

    The message names the command and the first line of git's stderr that
    says why; ``command``, ``stderr`` and ``returncode`` (None when git never
    ran, e.g. an injected failure) keep the details.
    """

    def __init__(
        self,
        command: Sequence[str],
        stderr: str = "",
        returncode: int | None = None,
        *,
        detail: str | None = None,
    ) -> None:
        self.command = tuple(command)
        self.stderr = stderr
        self.returncode = returncode
        message = f"`{shlex.join(self.command)}` failed"
        if returncode is not None:
            message += f" (exit {returncode})"
        message += f": {first_line(stderr)}"
        if detail:
            message += f"; {detail}"
        super().__init__(message)


class NotARepository(GitError):
    """``path`` is not the top directory of a git working tree (or does not exist)."""

    def __init__(
        self, command: Sequence[str], stderr: str, returncode: int | None, *, path: Path
    ) -> None:
        self.path = path
        super().__init__(command, stderr, returncode)


class WorktreeExists(GitError):
    """``add_worktree`` found something at ``path``: a non-empty directory, a file,
    or a registration whose directory is missing (prune first)."""

    def __init__(
        self, command: Sequence[str], stderr: str, returncode: int | None, *, path: Path
    ) -> None:
        self.path = path
        super().__init__(command, stderr, returncode)


class WorktreeDirty(GitError):
    """``remove_worktree`` refused: the worktree has modified or untracked files."""

    def __init__(
        self,
        command: Sequence[str],
        stderr: str,
        returncode: int | None,
        *,
        path: Path,
        modified: tuple[str, ...],
        untracked: tuple[str, ...],
    ) -> None:
        self.path = path
        self.modified = modified
        self.untracked = untracked
        parts = []
        if modified:
            parts.append("modified: " + ", ".join(modified))
        if untracked:
            parts.append("untracked: " + ", ".join(untracked))
        super().__init__(command, stderr, returncode, detail="; ".join(parts) or None)


class Git(Protocol):
    """The git operations herdsman relies on; see the module docstring for paths.

    Implementations serialise the operations that take a repository's locks
    (``add_worktree``, ``remove_worktree``, ``prune``) per source repository,
    so callers may issue them concurrently; different repositories proceed in
    parallel. Every method may raise :class:`GitError`.
    """

    async def is_repository(self, path: Path) -> bool:
        """Whether ``path`` is the top directory of a git working tree (main or linked).

        False for a missing path, a plain directory, or a subdirectory of a
        repository. Never raises :class:`NotARepository`.
        """
        ...

    async def head(self, repo: Path) -> str:
        """The full commit id HEAD of ``repo`` points at.

        Raises :class:`NotARepository` when ``repo`` is not a repository.
        """
        ...

    async def add_worktree(
        self, repo: Path, path: Path, *, branch: str | None, commit: str
    ) -> None:
        """Create a linked worktree of ``repo`` at ``path``, checked out at ``commit``.

        With ``branch=None`` the worktree is on a detached HEAD; otherwise a new
        branch ``branch`` is created at ``commit`` and checked out (an existing
        branch of that name is a :class:`GitError`). Missing parent directories
        are created; an existing *empty* directory at ``path`` is used.
        Raises :class:`WorktreeExists` when ``path`` is a file, a non-empty
        directory or a registered worktree whose directory is missing; nothing
        (no branch either) is created then. ``commit`` is a commit id or a ref
        (``HEAD``, a branch name).
        """
        ...

    async def branch_exists(self, repo: Path, branch: str) -> bool:
        """Whether ``repo`` has a local branch named ``branch``."""
        ...

    async def add_worktree_on(self, repo: Path, path: Path, *, branch: str) -> None:
        """Create a linked worktree of ``repo`` at ``path`` on the existing ``branch``.

        The counterpart of :meth:`add_worktree` for a branch made earlier (a
        conversation coming back after its worktree was swept): its commits
        are all there. Same path rules and errors as :meth:`add_worktree`; a
        missing branch, or one checked out in another worktree, is a
        :class:`GitError`.
        """
        ...

    async def worktree_status(self, path: Path) -> WorktreeState:
        """The clean/modified/untracked state of the worktree at ``path``.

        A missing directory gives :data:`MISSING`. A directory that is not the
        top of a working tree raises :class:`NotARepository`. Works on the
        main working tree too.
        """
        ...

    async def remove_worktree(self, repo: Path, path: Path) -> None:
        """Remove the linked worktree at ``path`` of ``repo``, never forcing.

        Deletes the directory (ignored files included) and its registration.
        A registered worktree whose directory is already gone just loses its
        registration. Raises :class:`WorktreeDirty` (naming the files) when it
        has modified or untracked files, and :class:`GitError` when ``path``
        is not a linked worktree of ``repo`` (the main working tree included).
        """
        ...

    async def prune(self, repo: Path) -> None:
        """Drop the registrations of ``repo``'s worktrees whose directories are gone."""
        ...

    async def list_worktrees(self, repo: Path) -> list[WorktreeEntry]:
        """``repo``'s linked worktrees (the main working tree excluded), sorted by path."""
        ...

    async def worktree_head(self, path: Path) -> WorktreeHead:
        """The repository the working tree whose top is ``path`` belongs to, and its branch.

        One look at ``path``, whatever the number of worktrees. Raises
        :class:`NotARepository` when ``path`` is missing, not the top of a
        working tree, or a linked worktree its repository does not have
        registered *at this path* (the registration is gone, or it names
        another folder: a copy of a worktree is not that worktree).
        """
        ...
