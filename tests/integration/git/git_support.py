"""Helpers and fixtures shared by the git tests.

A module, not a conftest: every test folder's conftest is imported under the
one name ``conftest``, and pyfakefs only patches modules it finds in
``sys.modules`` — a fixture body in a shadowed conftest would see the real
``pathlib`` under the fake filesystem.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import pytest

from herdsman.config import Repo
from herdsman.runtime.git import FakeGit, Git, RealGit
from herdsman.runtime.worktrees.manager import WorktreeManager

FILES = {"README.md": "hello\n", "src/app.py": "print('app')\n"}


def git_init(path: Path, files: Mapping[str, str]) -> None:
    """A real repository with one commit of ``files``; config is local to it."""
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(text.encode())

    def run(*args: str) -> None:
        subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True)

    run("init", "-q", "-b", "main")
    run("config", "user.name", "herdsman tests")
    run("config", "user.email", "tests@herdsman.invalid")
    run("add", "-A")
    # A global commit.gpgsign=true must not make the fixture need a key.
    run("-c", "commit.gpgsign=false", "commit", "-q", "-m", "initial")


MakeRepo = Callable[[Path, Mapping[str, str]], object]


def implementation(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Git, Path, MakeRepo]:
    """Real git in ``tmp_path``, or the fake on a pyfakefs filesystem, by parameter.

    Returns the git, the folder to build in, and how to make a repository.
    """
    if request.param == "real":
        return RealGit(), tmp_path.resolve(), git_init
    request.getfixturevalue("fs")  # every path below is on the fake filesystem
    fake = FakeGit()
    return fake, Path("/sim"), fake.init_repository


@attrs.frozen
class World:
    git: Git
    app: Repo
    lib: Repo
    root: Path
    clock: list[float]
    make: MakeRepo  # a new repository of FILES

    def manager(self, *repos: Repo) -> WorktreeManager:
        return WorktreeManager(
            self.git, self.root, repos or (self.app, self.lib), wall=lambda: self.clock[0]
        )


@pytest.fixture(params=["real", "fake"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    git, base, make = implementation(request, tmp_path)
    for name in ("app", "lib"):
        make(base / "src" / name, FILES)
    return World(
        git=git,
        app=Repo(name="app", path=base / "src" / "app"),
        lib=Repo(name="lib", path=base / "src" / "lib"),
        root=base / "state" / "worktrees",
        clock=[1000.0],
        make=make,
    )
