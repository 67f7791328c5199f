"""``herdsman-demo-agent``: its help page and its usage errors read as a command's."""

from __future__ import annotations

import pytest

from herdsman.demo_agent import DELAY_ENV, main


def test_the_help_names_the_installed_command_in_plain_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    page = capsys.readouterr().out
    assert page.startswith("usage: herdsman-demo-agent ")
    assert "``" not in page  # no docstring markup
    assert "--protocol {plain,claude}\n" in page
    assert 'protocol = "claude"' in " ".join(page.split())


def test_a_delay_in_the_environment_that_is_no_number_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DELAY_ENV, "soon")
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()
    assert error[-1] == (
        f"herdsman-demo-agent: error: ${DELAY_ENV} must be a number of seconds, got 'soon'"
    )
