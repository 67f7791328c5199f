"""The README's set-up commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    return [
        line
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_readme_has_the_two_setup_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2
    assert "supervisor.toml.example" in commands[0]
    assert "pytest" in commands[1]


def test_the_readme_runs_herdsman_on_a_copy_the_user_owns() -> None:
    # Never on the tracked example: an edit (`config set`) would change it.
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first = readme_commands()[0]
    assert "cp supervisor.toml.example supervisor.toml" in first
    assert "herdsman run" in first
    commands = re.findall(r"herdsman [a-z]+[^\n`]*", text)
    assert commands
    assert [c for c in commands if "-c supervisor.toml.example" in c] == []
    # The copy is git-ignored (only at the top: docs may name other files so).
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/supervisor.toml" in ignored


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert readme_commands()[1] in ci
