"""``herdsman runs RUN_ID``: one run, its agent's excerpt as readable text."""

from __future__ import annotations

from pathlib import Path

import pytest

from herdsman import runs_cli
from herdsman.runtime.runner.protocols import LogText

STREAMS = Path(__file__).resolve().parents[1] / "fixtures" / "agent_streams"


@pytest.mark.parametrize("name", ["claude-tools", "codex-session"])
def test_an_agent_streams_excerpt_is_shown_as_text(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    excerpt = (STREAMS / f"{name}.stdout").read_text()
    runs_cli._print_run({"id": "run-1", "status": "failed", "excerpt": excerpt})
    shown = capsys.readouterr().out
    rendered = LogText()
    text = rendered.feed(excerpt.encode()) + rendered.finish()
    assert text.strip(), "the fixture renders to something"
    for line in text.strip().splitlines():
        assert f"    {line}".rstrip() in shown
    assert '{"type"' not in shown


def test_a_plain_excerpt_is_shown_as_recorded(capsys: pytest.CaptureFixture[str]) -> None:
    runs_cli._print_run({"id": "run-1", "excerpt": "line one\n{not json\n"})
    assert capsys.readouterr().out.splitlines()[2:] == ["    line one", "    {not json"]
