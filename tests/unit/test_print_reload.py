"""How `herdsman reload` and `config set` print a reload's answer."""

from __future__ import annotations

import pytest

from herdsman.reload_cli import print_reload
from herdsman.runtime.reload import Change, ReloadResult


def test_a_rejected_reload_is_one_report_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    # The watcher rejected the file first: the answer is that reload, and says so.
    body = ReloadResult(
        False,
        3,
        "file changed",
        0.0,
        errors=("s.toml:8:15: providers.demo.concurrency: bad",),
        repeat=True,
    ).as_json()
    print_reload(body, "the running supervisor reloaded the file:")
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert lines[0] == "the running supervisor reloaded the file:"
    assert lines[1].startswith("the file is unchanged since it was reloaded (file changed, ")
    assert lines[2:] == [
        "reload rejected; nothing changed (generation 3 stays in force):",
        "  s.toml:8:15: providers.demo.concurrency: bad",
    ]


def test_an_applied_reload_prints_a_line_per_change(capsys: pytest.CaptureFixture[str]) -> None:
    changes = (
        Change("providers.echo", None, None, True, "added"),
        Change("providers.demo.concurrency", 1, 2, True),
        Change("api.listen", "a", "b", False),
    )
    print_reload(ReloadResult(True, 2, "API", 0.0, changes).as_json())
    out, err = capsys.readouterr()
    assert err == ""
    assert out.splitlines() == [
        "  providers.echo: added  (applied)",
        "  providers.demo.concurrency: 1 -> 2  (applied)",
        '  api.listen: "a" -> "b"  (needs a restart; the running value is kept)',
        "generation 2",
    ]
