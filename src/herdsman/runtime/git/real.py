"""``RealGit``: the git port backed by the ``git`` binary, run with trio.

Each operation is one (occasionally two) ``git`` processes, started without a
shell, with output captured and ``check=False``; the exit status and stderr
are mapped to the port's errors. The environment is the parent's with the
variables that would redirect git to another repository removed, plus:

* ``LC_ALL=C``: stable, English messages, since errors are recognised by text;
* ``GIT_TERMINAL_PROMPT=0``: git must never wait for a password on a tty;
* ``GIT_CEILING_DIRECTORIES=<parent of the directory git runs in>``: git
  looks for a repository in that directory only, never in the directories
  above it, so a stray path inside some other checkout (the state dir may
  well live in one) cannot act on that checkout.

Needs git 2.36 or newer (``worktree list -z``).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

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

# `git rev-parse --local-env-vars`: variables that point git at a particular
# repository. Inherited from, say, a git hook that started the supervisor,
# they would silently redirect every command.
_REPOSITORY_ENV = frozenset(
    {
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_OBJECT_DIRECTORY",
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_IMPLICIT_WORK_TREE",
        "GIT_GRAFT_FILE",
        "GIT_INDEX_FILE",
        "GIT_NO_REPLACE_OBJECTS",
        "GIT_REPLACE_REF_BASE",
        "GIT_PREFIX",
        "GIT_INTERNAL_SUPER_PREFIX",
        "GIT_SHALLOW_FILE",
        "GIT_COMMON_DIR",
    }
)

_NOT_A_REPOSITORY = re.compile(r"^fatal: (not a git repository|cannot change to )", re.MULTILINE)
_EXISTS = re.compile(
    r"^fatal: '.*' (already exists|is a missing but (already registered|locked) worktree)",
    re.MULTILINE,
)
_DIRTY = re.compile(r"^fatal: '.*' contains modified or untracked files", re.MULTILINE)


@attrs.frozen
class _Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: str


def _absolute(path: Path) -> Path:
    # realpath, as git stores and reports resolved paths; comparing and
    # locking on anything else would make one directory look like two.
    return Path(os.path.realpath(path))


class RealGit:
    """The :class:`~herdsman.runtime.git.port.Git` port on the real ``git`` binary.

    ``git`` is the executable to run (a name looked up on PATH, or a path).
    ``add_worktree``, ``remove_worktree`` and ``prune`` hold a ``trio.Lock``
    per source repository (keyed by its resolved path) while git runs: git
    takes repository-wide locks for these, and concurrent ones in one
    repository can fail ("could not lock config file", racing on
    ``.git/worktrees/<name>``). Different repositories run in parallel.
    Pass the main repository's path as ``repo``: the lock key is the path
    given, not git's common directory.

    Cancellation: trio delivers SIGTERM to a running git; ``git worktree add``
    cleans up a half-made worktree on that signal.
    """

    def __init__(self, git: str = "git") -> None:
        self._git = git
        self._locks: dict[str, trio.Lock] = {}

    def _lock(self, repo: Path) -> trio.Lock:
        # One lock per configured repository; the dict is bounded by the
        # number of repositories, so it is never trimmed.
        # Keyed by the resolved path's text (as FakeGit, where Path objects
        # from before and after pyfakefs's patch may differ as dict keys).
        return self._locks.setdefault(os.fspath(repo), trio.Lock())

    async def _run(self, cwd: Path, *args: str, optional_locks: bool = True) -> _Result:
        # No hooks: herdsman runs git unattended, and a repository's
        # post-checkout hook could hang a run's start or do anything at all.
        argv = (self._git, "-c", "core.hooksPath=/dev/null", "-C", str(cwd), *args)
        env = {key: value for key, value in os.environ.items() if key not in _REPOSITORY_ENV}
        env |= {
            "LC_ALL": "C",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_CEILING_DIRECTORIES": str(cwd.parent),
        }
        if not optional_locks:
            # status may otherwise take index.lock to refresh the index and
            # collide with a concurrent add/remove in the same repository.
            env["GIT_OPTIONAL_LOCKS"] = "0"
        try:
            done = await trio.run_process(
                argv,
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=env,
            )
        except OSError as exc:  # git missing or not executable
            raise GitError(argv, f"fatal: cannot run {self._git}: {exc}") from exc
        result = _Result(
            argv=argv,
            returncode=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr.decode("utf-8", errors="replace"),
        )
        if result.returncode != 0 and _NOT_A_REPOSITORY.search(result.stderr):
            raise NotARepository(argv, result.stderr, result.returncode, path=cwd)
        return result

    @staticmethod
    def _fail(result: _Result) -> GitError:
        return GitError(result.argv, result.stderr, result.returncode)

    async def is_repository(self, path: Path) -> bool:
        """See :meth:`Git.is_repository`."""
        path = _absolute(path)
        if not path.is_dir():
            return False
        try:
            # With the ceiling at the parent, this succeeds only at the top of
            # a working tree: not in a subdirectory, not in a bare repository.
            result = await self._run(path, "rev-parse", "--show-toplevel")
        except NotARepository:
            return False
        return result.returncode == 0

    async def head(self, repo: Path) -> str:
        """See :meth:`Git.head`."""
        result = await self._run(_absolute(repo), "rev-parse", "--verify", "HEAD^{commit}")
        if result.returncode != 0:
            raise self._fail(result)
        return result.stdout.decode("ascii").strip()

    async def add_worktree(
        self, repo: Path, path: Path, *, branch: str | None, commit: str
    ) -> None:
        """See :meth:`Git.add_worktree`."""
        repo, path = _absolute(repo), _absolute(path)
        args: tuple[str, ...]
        if branch is None:
            args = ("worktree", "add", "--quiet", "--detach", str(path), commit)
        else:
            args = ("worktree", "add", "--quiet", "-b", branch, str(path), commit)
        # git 2.39 creates the branch *before* it checks the path, so a refused
        # add would leave a stray branch behind: check first.
        await self._add(repo, path, args, check_first=branch is not None)

    async def branch_exists(self, repo: Path, branch: str) -> bool:
        """See :meth:`Git.branch_exists`."""
        repo = _absolute(repo)
        result = await self._run(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}")
        return result.returncode == 0

    async def add_worktree_on(self, repo: Path, path: Path, *, branch: str) -> None:
        """See :meth:`Git.add_worktree_on`."""
        repo, path = _absolute(repo), _absolute(path)
        args = ("worktree", "add", "--quiet", str(path), branch)
        await self._add(repo, path, args, check_first=True)

    async def _add(
        self, repo: Path, path: Path, args: tuple[str, ...], *, check_first: bool
    ) -> None:
        async with self._lock(repo):
            if check_first:
                await self._check_free(repo, path, args)
            result = await self._run(repo, *args)
        if result.returncode == 0:
            return
        if _EXISTS.search(result.stderr):
            raise WorktreeExists(result.argv, result.stderr, result.returncode, path=path)
        raise self._fail(result)

    async def _check_free(self, repo: Path, path: Path, args: tuple[str, ...]) -> None:
        argv = (self._git, "-C", str(repo), *args)
        if path.exists() and not (path.is_dir() and not any(path.iterdir())):
            raise WorktreeExists(argv, f"fatal: '{path}' already exists", None, path=path)
        for entry in await self.list_worktrees(repo):
            if entry.path == path and not path.exists():
                stderr = f"fatal: '{path}' is a missing but already registered worktree;"
                raise WorktreeExists(argv, stderr, None, path=path)

    async def worktree_status(self, path: Path) -> WorktreeState:
        """See :meth:`Git.worktree_status`."""
        path = _absolute(path)
        if not path.is_dir():
            return MISSING
        try:
            result = await self._run(
                path,
                "status",
                "--porcelain=v1",
                "-z",
                "--untracked-files=all",
                optional_locks=False,
            )
        except NotARepository:
            if not path.is_dir():  # deleted while git ran
                return MISSING
            raise
        if result.returncode != 0:
            raise self._fail(result)
        return _parse_status(result.stdout)

    async def remove_worktree(self, repo: Path, path: Path) -> None:
        """See :meth:`Git.remove_worktree`."""
        repo, path = _absolute(repo), _absolute(path)
        async with self._lock(repo):
            result = await self._run(repo, "worktree", "remove", str(path))
            if result.returncode == 0:
                return
            if _DIRTY.search(result.stderr):
                # git names no files; ask status, still under the lock so the
                # answer belongs to the refusal.
                state = await self.worktree_status(path)
                raise WorktreeDirty(
                    result.argv,
                    result.stderr,
                    result.returncode,
                    path=path,
                    modified=state.modified,
                    untracked=state.untracked,
                )
        raise self._fail(result)

    async def prune(self, repo: Path) -> None:
        """See :meth:`Git.prune`."""
        repo = _absolute(repo)
        async with self._lock(repo):
            result = await self._run(repo, "worktree", "prune")
        if result.returncode != 0:
            raise self._fail(result)

    async def worktree_head(self, path: Path) -> WorktreeHead:
        """See :meth:`Git.worktree_head`."""
        path = _absolute(path)
        result = await self._run(
            path,
            "rev-parse",
            "--path-format=absolute",
            "--git-dir",
            "--git-common-dir",
            "--symbolic-full-name",
            "HEAD",
        )
        if result.returncode != 0:
            raise self._fail(result)
        # The ceiling (the parent of path) makes git fail in a subdirectory.
        git_dir, common, head = (Path(line) for line in os.fsdecode(result.stdout).splitlines())
        if git_dir != common:
            # A linked worktree: git follows the .git file without checking
            # that the registration points back here, so a copied folder
            # would pass for the worktree it was copied from.
            try:
                registered = Path((git_dir / "gitdir").read_text(encoding="utf-8").strip())
            except OSError:
                registered = None
            if registered != path / ".git":
                stderr = (
                    f"fatal: not a git repository: {path} is not where {git_dir} says its"
                    f" worktree is ({registered})"
                )
                raise NotARepository(result.argv, stderr, 128, path=path)
        ref = str(head)
        branch = ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
        return WorktreeHead(git_dir=common, branch=branch)

    async def list_worktrees(self, repo: Path) -> list[WorktreeEntry]:
        """See :meth:`Git.list_worktrees`."""
        result = await self._run(_absolute(repo), "worktree", "list", "--porcelain", "-z")
        if result.returncode != 0:
            raise self._fail(result)
        entries = _parse_worktree_list(result.stdout)
        # git lists the main working tree first; the port reports linked ones.
        return sorted(entries[1:], key=lambda entry: entry.path)


def _parse_status(output: bytes) -> WorktreeState:
    """Parse ``git status --porcelain=v1 -z`` output."""
    modified: list[str] = []
    untracked: list[str] = []
    fields = output.split(b"\0")
    index = 0
    while index < len(fields):
        field = fields[index]
        index += 1
        if not field:
            continue
        code, name = field[:2], os.fsdecode(field[3:])
        if code == b"??":
            untracked.append(name)
        elif code != b"!!":
            modified.append(name)
            if b"R" in code or b"C" in code:
                index += 1  # a rename or copy is followed by its source path
    return WorktreeState(
        exists=True,
        clean=not modified and not untracked,
        modified=tuple(sorted(modified)),
        untracked=tuple(sorted(untracked)),
    )


def _parse_worktree_list(output: bytes) -> list[WorktreeEntry]:
    """Parse ``git worktree list --porcelain -z``: records of fields, ended by an empty one."""
    entries: list[WorktreeEntry] = []
    record: dict[str, str] = {}
    for raw in output.split(b"\0"):
        if raw:
            key, _, value = os.fsdecode(raw).partition(" ")
            record[key] = value
            continue
        if "worktree" in record:
            branch = record.get("branch")
            entries.append(
                WorktreeEntry(
                    path=Path(record["worktree"]),
                    head=record.get("HEAD", ""),
                    branch=branch.removeprefix("refs/heads/") if branch else None,
                    prunable="prunable" in record,
                )
            )
        record = {}
    return entries
