"""``herdsman check`` on a copy of the example: warnings about this machine, never a failure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "supervisor.toml.example"


def test_check_warns_about_missing_programs_and_account_folders(tmp_path: Path) -> None:
    # The accounts uncommented as the example says, their folders not made yet.
    head, codex_and_rest = EXAMPLE.read_text().split("[providers.codex]", 1)
    head = re.sub(
        r"^# (\[\[providers\.claude\.accounts\]\]|(?:name|env|window|budget|budget_unit"
        r"|concurrency) = .*)$",
        r"\1",
        head,
        flags=re.MULTILINE,
    )
    text = head + "[providers.codex]" + codex_and_rest
    config = tmp_path / "supervisor.toml"
    config.write_text(text)
    lines = text.splitlines()
    checked = subprocess.run(
        [sys.executable, "-m", "herdsman", "check", "-c", str(config)],
        cwd=tmp_path,
        env={"PATH": "/nonexistent", "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    warnings = checked.stdout.split("\nwarnings:\n", 1)[1].splitlines()

    def line_of(fragment: str) -> int:
        return next(n for n, line in enumerate(lines, 1) if fragment in line)

    work, personal = line_of("/home/you/.claude-work"), line_of("/home/you/.claude-personal")
    claude, codex = line_of('exec = ["claude"'), line_of('exec = ["codex"')
    assert [w.split(": ", 2)[:2] for w in warnings] == [
        [f"  {config}:{work}", "providers.claude.accounts[0].env.CLAUDE_CONFIG_DIR"],
        [f"  {config}:{personal}", "providers.claude.accounts[1].env.CLAUDE_CONFIG_DIR"],
        [f"  {config}:{claude}", "providers.claude.exec"],
        [f"  {config}:{codex}", "providers.codex.exec"],
    ]
    assert "/home/you/.claude-work does not exist" in warnings[0]
    assert "'claude' was not found on PATH" in warnings[2]
