"""``FakeGit``: the git port for the simulator, built from plain file operations.

It never spawns a process (under pyfakefs a child process breaks, and would
see the real disk anyway); everything is ``os``/``pathlib``/``shutil`` on
whatever filesystem is active. State lives in that filesystem, laid out like
git's own, so a test can break things by hand exactly as with real git:

* a repository is a directory with a ``.git/`` directory holding
  ``herdsman-fake-repo.json``: its commits (id → {path: text}), branches and
  HEAD. Only :meth:`FakeGit.init_repository` makes one (one commit).
* a linked worktree is a directory holding the commit's files and a ``.git``
  *file* (``gitdir: <repo>/.git/worktrees/<name>``), registered by
  ``<repo>/.git/worktrees/<name>/herdsman-fake-worktree.json``.

Modelled: clean/modified/untracked (worktree files compared with the commit,
byte for byte), a root ``.gitignore`` with simple patterns (``*.log``,
``build/``, ``/anchored/path``; no negation, no nested ``.gitignore`` files;
tracked files are never ignored), the per-repository lock, stale
registrations and prune, and git's error messages for what the contract
tests check. Not modelled: commits after the first (so a worktree's HEAD
never moves), the index/staging, file modes, symlinks as tracked content,
submodules and nested repositories, locked worktrees, bare repositories.
"""

from __future__ import annotations

import collections
import fnmatch
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal, get_args

import attrs
import trio

from herdsman.runtime.git.port import (
    MISSING,
    GitError,
    NotARepository,
    WorktreeDirty,
    WorktreeEntry,
    WorktreeExists,
    WorktreeHead,
    WorktreeState,
)

Operation = Literal[
    "is_repository",
    "head",
    "add_worktree",
    "branch_exists",
    "add_worktree_on",
    "worktree_status",
    "remove_worktree",
    "prune",
    "list_worktrees",
    "worktree_head",
]
"""The port operations :meth:`FakeGit.inject_failure` can target."""

_STATE = "herdsman-fake-repo.json"
_REGISTRATION = "herdsman-fake-worktree.json"


@attrs.frozen
class _Located:
    """Where a path stands: its repository's root, and its worktree name if linked."""

    repo: Path
    worktree: str | None


def _absolute(path: Path) -> Path:
    # Same rule as RealGit: git stores and reports resolved paths.
    return Path(os.path.realpath(path))


def _commit_id(files: Mapping[str, str]) -> str:
    # Content-addressed, like git, so ids are deterministic across runs and
    # processes (never random, never dependent on the order of calls).
    canonical = json.dumps(dict(files), sort_keys=True).encode("utf-8")
    return hashlib.sha1(b"herdsman-fake-commit\0" + canonical, usedforsecurity=False).hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")


def _write_files(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        # Bytes, so no newline translation: status compares bytes.
        target.write_bytes(text.encode("utf-8"))


def _check_name(name: str) -> None:
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] == ".git":
        raise ValueError(f"not a repository-relative file name: {name!r}")


def _ignore_patterns(top: Path) -> list[str]:
    try:
        text = (top / ".gitignore").read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return []
    patterns = []
    for line in text.splitlines():
        pattern = line.strip()
        # Negation is not modelled; skipping it errs towards "dirty", the safe side.
        if pattern and not pattern.startswith(("#", "!")):
            patterns.append(pattern)
    return patterns


def _ignored(name: str, patterns: list[str]) -> bool:
    """Whether untracked ``name`` (posix, relative) matches a root ``.gitignore`` pattern."""
    parts = name.split("/")
    for raw in patterns:
        dir_only = raw.endswith("/")
        pattern = raw.rstrip("/")
        anchored = "/" in pattern
        pattern = pattern.lstrip("/")
        # A pattern ignores a path if it matches the path or one of the
        # directories leading to it; a dir-only one only the directories.
        depth = len(parts) - 1 if dir_only else len(parts)
        for end in range(1, depth + 1):
            candidate = "/".join(parts[:end]) if anchored else parts[end - 1]
            if fnmatch.fnmatchcase(candidate, pattern):
                return True
    return False


class FakeGit:
    """The :class:`~herdsman.runtime.git.port.Git` port on the active filesystem.

    See the module docstring for what it models. Failure injection:
    :meth:`inject_failure` makes the next call of one operation raise a given
    error before it changes anything, as a git that failed cleanly would.
    ``latency`` gives how long (trio seconds) each call takes before it acts,
    as a git process would: the simulator's fuzzer uses it so that sweeps,
    checkouts and submits overlap.
    """

    def __init__(self, *, latency: Callable[[Operation], float] | None = None) -> None:
        self._latency = latency
        self._locks: dict[str, trio.Lock] = {}
        self._failures: dict[str, collections.deque[Exception]] = collections.defaultdict(
            collections.deque
        )

    # -- setting up and steering -------------------------------------------------

    def init_repository(self, path: Path, files: Mapping[str, str], *, branch: str = "main") -> str:
        """Create a repository at ``path`` whose one commit holds ``files``; return its id.

        ``files`` maps repository-relative posix paths to text (stored as
        UTF-8). The files are written to ``path`` too, so the main working
        tree starts clean. Raises FileExistsError if ``path`` is already one.
        """
        path = _absolute(path)
        for name in files:
            _check_name(name)
        if (path / ".git").exists():
            raise FileExistsError(f"{path} already has a .git")
        commit = _commit_id(files)
        _write_files(path, files)
        (path / ".git" / "worktrees").mkdir(parents=True)
        _write_json(
            path / ".git" / _STATE,
            {
                "head": commit,
                "branch": branch,
                "branches": {branch: commit},
                "commits": {commit: dict(files)},
            },
        )
        return commit

    def inject_failure(self, operation: Operation, error: Exception) -> None:
        """Make the next call of ``operation`` raise ``error`` without side effects.

        Calls queue up: injecting twice fails the next two calls. Typical use:
        ``GitError(["git", "worktree", "add"], "fatal: No space left on device")``.
        """
        if operation not in get_args(Operation):
            raise ValueError(f"unknown git operation: {operation!r}")
        self._failures[operation].append(error)

    @property
    def pending_failures(self) -> int:
        """How many injected failures no call has met yet."""
        return sum(len(pending) for pending in self._failures.values())

    async def _enter(self, operation: Operation) -> None:
        # Every operation is a checkpoint, as a process-running one would be,
        # so concurrent callers interleave in the simulator as in production.
        seconds = self._latency(operation) if self._latency is not None else 0.0
        if seconds > 0:
            await trio.sleep(seconds)
        else:
            await trio.lowlevel.checkpoint()
        pending = self._failures.get(operation)
        if pending:
            raise pending.popleft()

    def _lock(self, repo: Path) -> trio.Lock:
        # Keyed by the path's text: under pyfakefs, a Path made before the patch
        # began and one made during it can name one directory yet differ as keys.
        return self._locks.setdefault(os.fspath(repo), trio.Lock())

    # -- reading the on-disk model -----------------------------------------------

    @staticmethod
    def _argv(cwd: Path, *args: str) -> tuple[str, ...]:
        # The command real git would have run, so errors read the same.
        return ("git", "-C", str(cwd), *args)

    def _locate(self, path: Path, argv: tuple[str, ...]) -> _Located:
        """The repository ``path`` is the top of, or NotARepository as git words it."""
        if not path.is_dir():
            stderr = f"fatal: cannot change to '{path}': No such file or directory"
            raise NotARepository(argv, stderr, 128, path=path)
        dot_git = path / ".git"
        if dot_git.is_dir() and (dot_git / _STATE).is_file():
            return _Located(repo=path, worktree=None)
        if dot_git.is_file():
            text = dot_git.read_text(encoding="utf-8").strip()
            gitdir = Path(text.removeprefix("gitdir: "))
            registration = gitdir / _REGISTRATION
            if (
                text.startswith("gitdir: ")
                and registration.is_file()
                and Path(_read_json(registration)["path"]) == path
            ):
                return _Located(repo=gitdir.parent.parent.parent, worktree=gitdir.name)
        stderr = "fatal: not a git repository (or any of the parent directories): .git"
        raise NotARepository(argv, stderr, 128, path=path)

    @staticmethod
    def _state(repo: Path) -> dict[str, Any]:
        return _read_json(repo / ".git" / _STATE)

    @staticmethod
    def _registrations(repo: Path) -> dict[str, dict[str, Any]]:
        """Worktree name → registration record, for every registered worktree."""
        found = {}
        base = repo / ".git" / "worktrees"
        for entry in sorted(base.iterdir()) if base.is_dir() else []:
            record = entry / _REGISTRATION
            if record.is_file():
                found[entry.name] = _read_json(record)
        return found

    def _head_of(self, located: _Located) -> str:
        if located.worktree is None:
            head: str = self._state(located.repo)["head"]
            return head
        record = _read_json(located.repo / ".git" / "worktrees" / located.worktree / _REGISTRATION)
        worktree_head: str = record["head"]
        return worktree_head

    @staticmethod
    def _resolve_commit(state: Mapping[str, Any], rev: str, argv: tuple[str, ...]) -> str:
        commits: Mapping[str, Any] = state["commits"]
        branches: Mapping[str, str] = state["branches"]
        if rev == "HEAD":
            return str(state["head"])
        if rev in branches:
            return branches[rev]
        matches = [commit for commit in commits if len(rev) >= 4 and commit.startswith(rev)]
        if len(matches) == 1:
            return matches[0]
        raise GitError(argv, f"fatal: invalid reference: {rev}", 128)

    def _status(self, top: Path, files: Mapping[str, str]) -> WorktreeState:
        modified = []
        for name, text in files.items():
            try:
                if (top / name).read_bytes() != text.encode("utf-8"):
                    modified.append(name)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                modified.append(name)  # deleted, or replaced by a directory
        patterns = _ignore_patterns(top)
        untracked = []
        for directory, dirnames, filenames in os.walk(top):
            relative = Path(directory).relative_to(top).as_posix()
            prefix = "" if relative == "." else relative + "/"
            if not prefix:
                # The top's .git (a directory in the main tree, a file in a
                # linked one, skipped below) is git's own, never content.
                dirnames[:] = [name for name in dirnames if name != ".git"]
            for filename in filenames:
                if not prefix and filename == ".git":
                    continue
                name = prefix + filename
                if name not in files and not _ignored(name, patterns):
                    untracked.append(name)
        return WorktreeState(
            exists=True,
            clean=not modified and not untracked,
            modified=tuple(sorted(modified)),
            untracked=tuple(sorted(untracked)),
        )

    # -- the port ----------------------------------------------------------------

    async def is_repository(self, path: Path) -> bool:
        """See :meth:`Git.is_repository`."""
        await self._enter("is_repository")
        path = _absolute(path)
        try:
            self._locate(path, self._argv(path, "rev-parse", "--show-toplevel"))
        except NotARepository:
            return False
        return True

    async def head(self, repo: Path) -> str:
        """See :meth:`Git.head`."""
        await self._enter("head")
        repo = _absolute(repo)
        return self._head_of(self._locate(repo, self._argv(repo, "rev-parse", "HEAD")))

    async def add_worktree(
        self, repo: Path, path: Path, *, branch: str | None, commit: str
    ) -> None:
        """See :meth:`Git.add_worktree`."""
        repo, path = _absolute(repo), _absolute(path)
        how = ("--detach",) if branch is None else ("-b", branch)
        argv = self._argv(repo, "worktree", "add", "--quiet", *how, str(path), commit)

        def choose(state: dict[str, Any]) -> str:
            target = self._resolve_commit(state, commit, argv)
            if branch is not None and branch in state["branches"]:
                raise GitError(argv, f"fatal: a branch named '{branch}' already exists", 255)
            return target

        await self._add(
            "add_worktree",
            repo=repo,
            path=path,
            argv=argv,
            choose=choose,
            branch=branch,
            create_branch=True,
        )

    async def branch_exists(self, repo: Path, branch: str) -> bool:
        """See :meth:`Git.branch_exists`."""
        await self._enter("branch_exists")
        repo = _absolute(repo)
        argv = self._argv(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        return branch in self._state(self._locate(repo, argv).repo)["branches"]

    async def add_worktree_on(self, repo: Path, path: Path, *, branch: str) -> None:
        """See :meth:`Git.add_worktree_on`."""
        repo, path = _absolute(repo), _absolute(path)
        argv = self._argv(repo, "worktree", "add", "--quiet", str(path), branch)

        def choose(state: dict[str, Any]) -> str:
            if branch not in state["branches"]:
                raise GitError(argv, f"fatal: invalid reference: {branch}", 128)
            return str(state["branches"][branch])

        await self._add(
            "add_worktree_on",
            repo=repo,
            path=path,
            argv=argv,
            choose=choose,
            branch=branch,
            create_branch=False,
        )

    async def _add(
        self,
        operation: Operation,
        *,
        repo: Path,
        path: Path,
        argv: tuple[str, ...],
        choose: Callable[[dict[str, Any]], str],
        branch: str | None,
        create_branch: bool,
    ) -> None:
        await self._enter(operation)
        source = self._locate(repo, argv).repo
        async with self._lock(source):
            # Yield while holding the lock, as git runs while RealGit holds it,
            # so concurrent callers really do queue on it in the simulator.
            await trio.lowlevel.checkpoint()
            state = self._state(source)
            target = choose(state)
            if path.exists() and not (path.is_dir() and not any(path.iterdir())):
                raise WorktreeExists(argv, f"fatal: '{path}' already exists", 128, path=path)
            registrations = self._registrations(source)
            if any(Path(record["path"]) == path for record in registrations.values()):
                stderr = f"fatal: '{path}' is a missing but already registered worktree;"
                raise WorktreeExists(argv, stderr, 128, path=path)
            if branch is not None and not create_branch:
                for record in registrations.values():
                    if record["branch"] == branch:
                        stderr = f"fatal: '{branch}' is already checked out at '{record['path']}'"
                        raise GitError(argv, stderr, 128)
            # git names the registration after the directory, numbering clashes.
            name, number = path.name, 0
            while name in registrations or (source / ".git" / "worktrees" / name).exists():
                number += 1
                name = f"{path.name}{number}"
            gitdir = source / ".git" / "worktrees" / name
            _write_files(path, state["commits"][target])
            (path / ".git").write_text(f"gitdir: {gitdir}\n", encoding="utf-8")
            _write_json(
                gitdir / _REGISTRATION, {"path": str(path), "head": target, "branch": branch}
            )
            if branch is not None and create_branch:
                state["branches"][branch] = target
                _write_json(source / ".git" / _STATE, state)

    async def worktree_status(self, path: Path) -> WorktreeState:
        """See :meth:`Git.worktree_status`."""
        await self._enter("worktree_status")
        path = _absolute(path)
        if not path.is_dir():
            return MISSING
        argv = self._argv(path, "status", "--porcelain=v1", "-z", "--untracked-files=all")
        located = self._locate(path, argv)
        files = self._state(located.repo)["commits"][self._head_of(located)]
        return self._status(path, files)

    async def remove_worktree(self, repo: Path, path: Path) -> None:
        """See :meth:`Git.remove_worktree`."""
        repo, path = _absolute(repo), _absolute(path)
        argv = self._argv(repo, "worktree", "remove", str(path))
        await self._enter("remove_worktree")
        source = self._locate(repo, argv).repo
        async with self._lock(source):
            await trio.lowlevel.checkpoint()
            names = [
                name
                for name, record in self._registrations(source).items()
                if Path(record["path"]) == path
            ]
            if not names:
                what = "a main working tree" if path == source else "not a working tree"
                raise GitError(argv, f"fatal: '{path}' is {what}", 128)
            gitdir = source / ".git" / "worktrees" / names[0]
            if path.is_dir():
                located = _Located(repo=source, worktree=names[0])
                state = self._status(path, self._state(source)["commits"][self._head_of(located)])
                if not state.clean:
                    stderr = (
                        f"fatal: '{path}' contains modified or untracked files,"
                        " use --force to delete it"
                    )
                    raise WorktreeDirty(
                        argv,
                        stderr,
                        128,
                        path=path,
                        modified=state.modified,
                        untracked=state.untracked,
                    )
                shutil.rmtree(path)
            shutil.rmtree(gitdir)

    async def prune(self, repo: Path) -> None:
        """See :meth:`Git.prune`."""
        await self._enter("prune")
        repo = _absolute(repo)
        source = self._locate(repo, self._argv(repo, "worktree", "prune")).repo
        async with self._lock(source):
            await trio.lowlevel.checkpoint()
            for name, record in self._registrations(source).items():
                if not (Path(record["path"]) / ".git").exists():
                    shutil.rmtree(source / ".git" / "worktrees" / name)

    async def worktree_head(self, path: Path) -> WorktreeHead:
        """See :meth:`Git.worktree_head`."""
        await self._enter("worktree_head")
        path = _absolute(path)
        argv = self._argv(path, "rev-parse", "--git-common-dir", "--symbolic-full-name", "HEAD")
        located = self._locate(path, argv)
        if located.worktree is None:
            branch = self._state(located.repo).get("branch")
        else:
            registration = located.repo / ".git" / "worktrees" / located.worktree / _REGISTRATION
            branch = _read_json(registration)["branch"]
        return WorktreeHead(git_dir=located.repo / ".git", branch=branch)

    async def list_worktrees(self, repo: Path) -> list[WorktreeEntry]:
        """See :meth:`Git.list_worktrees`."""
        await self._enter("list_worktrees")
        repo = _absolute(repo)
        argv = self._argv(repo, "worktree", "list", "--porcelain", "-z")
        source = self._locate(repo, argv).repo
        entries = [
            WorktreeEntry(
                path=Path(record["path"]),
                head=record["head"],
                branch=record["branch"],
                prunable=not (Path(record["path"]) / ".git").exists(),
            )
            for record in self._registrations(source).values()
        ]
        return sorted(entries, key=lambda entry: entry.path)
