"""Warnings about the machine, not the file: missing binaries, repos that are not git."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from herdsman.config.load import LoadedConfig
from herdsman.executables import resolve_executable, scripts_dir

__all__ = ["environment_warnings", "is_git_checkout"]


def is_git_checkout(path: Path, git: str) -> bool:
    """Whether ``path`` is inside a git work tree, asking ``git`` itself."""
    result = subprocess.run(
        [git, "-C", str(path), "rev-parse", "--is-inside-work-tree"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0 and result.stdout.strip() == "true"


def _missing_path(value: str) -> bool:
    """Whether ``value`` names one absolute path (not a list of them) that does not exist."""
    return os.path.isabs(value) and os.pathsep not in value and not os.path.lexists(value)


def environment_warnings(loaded: LoadedConfig) -> list[str]:
    """Problems that would not stop a start but will bite later, one line each.

    An ``exec`` binary not found where runs will look for it (PATH, then
    herdsman's own scripts folder; a supervisor may start before the CLI is
    installed), a repo path that is missing or not a git checkout, an
    environment value starting with ``~`` (no shell runs the command, so
    nothing expands it), an environment value that is an absolute path that
    does not exist (an account's ``CLAUDE_CONFIG_DIR`` or ``CODEX_HOME`` not
    made yet: the CLI would start there logged out, or make it).
    """
    warnings: list[str] = []
    origins = loaded.origins
    for name, provider in loaded.config.providers.items():
        tables = [(f"providers.{name}.env", provider.env)]
        tables += [
            (f"providers.{name}.accounts[{n}].env", account.env)
            for n, account in enumerate(provider.accounts)
        ]
        for key, env in tables:
            for variable, value in env.items():
                if value.startswith("~"):
                    warnings.append(
                        f"{origins[key]}: {key}.{variable}: {value!r} starts with '~', which"
                        " nothing expands (no shell runs the command); write the full path"
                    )
                elif _missing_path(value):
                    warnings.append(
                        f"{origins[key]}: {key}.{variable}: {value} does not exist; runs"
                        " would find nothing there (a CLI's config folder starts logged out:"
                        " log in with this variable set first, or fix the path)"
                    )
    for name, provider in loaded.config.providers.items():
        key = f"providers.{name}.exec"
        program = provider.exec[0]
        if resolve_executable(program) is not None:
            continue
        if os.sep in program:
            problem = "does not exist or is not executable"
        else:
            problem = f"was not found on PATH nor in {scripts_dir()}"
        warnings.append(f"{origins[key]}: {key}: '{program}' {problem}")
    git = shutil.which("git")
    for number, repo in enumerate(loaded.config.repos):
        key = f"repos[{number}].path"
        if not repo.path.is_dir():
            warnings.append(f"{origins[key]}: {key}: {repo.path} is not a directory")
        elif git is not None and not is_git_checkout(repo.path, git):
            warnings.append(f"{origins[key]}: {key}: {repo.path} is not a git checkout")
    return warnings
