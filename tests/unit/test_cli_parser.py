"""The ``herdsman`` parser as a whole: every page explained, every usage error one line, exit 2.

These run ``main(argv)`` on arguments argparse or the command refuses before
any supervisor is asked, so no supervisor is needed; the commands' output
against a real one is tested in tests/integration/supervisor/test_cli_consistency.py.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from herdsman.cli import build_parser, main
from herdsman.cli_tables import Column, duration_text, plain_table
from herdsman.runs_cli import RUN_STATUSES
from herdsman.runtime.store import RunStatus


def _subparsers(
    parser: argparse.ArgumentParser, name: str = "herdsman"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from _subparsers(child, f"{name} {sub}")


def _pages() -> list[tuple[str, argparse.ArgumentParser]]:
    return list(_subparsers(build_parser()))


def test_the_walk_finds_every_command() -> None:
    names = {name for name, _ in _pages()}
    assert {
        "herdsman accounts",
        "herdsman cancel",
        "herdsman config add",
        "herdsman config get",
        "herdsman config remove",
        "herdsman config set",
        "herdsman logs",
        "herdsman sim diff",
        "herdsman sim fuzz",
        "herdsman sim view",
        "herdsman usage",
        "herdsman worktrees",
    } <= names
    assert len(names) == 24


@pytest.mark.parametrize(("name", "parser"), _pages(), ids=[name for name, _ in _pages()])
def test_every_help_page_has_a_description_and_explains_its_arguments(
    name: str, parser: argparse.ArgumentParser
) -> None:
    assert parser.description, f"{name} --help has no description"
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        shown = action.help not in (None, argparse.SUPPRESS)
        if not action.option_strings:  # a positional
            assert shown, f"{name}: the argument {action.metavar or action.dest} has no help"
        elif action.help is None:
            pytest.fail(f"{name}: the option {'/'.join(action.option_strings)} has no help")


CLIENTS = [
    ["submit", "-p", "demo", "hello"],
    ["status"],
    ["accounts"],
    ["accounts", "end-rest", "claude", "work"],
    ["runs"],
    ["runs", "run-1"],
    ["cancel", "run-1"],
    ["worktrees"],
    ["worktrees", "sweep"],
    ["reload"],
]


@pytest.mark.parametrize("argv", CLIENTS, ids=[" ".join(a[:2]) for a in CLIENTS])
def test_clients_of_a_running_supervisor_refuse_set(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The supervisor keeps its own settings: a --set here would change nothing.
    with pytest.raises(SystemExit) as exited:
        main([*argv, "-c", str(tmp_path / "none.toml"), "--set", "retention.idle=1s"])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"herdsman {argv[0]}: --set is not taken here: ")
    assert "herdsman config set KEY VALUE" in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["cancel"], "herdsman cancel: the following arguments are required: RUN_ID"),
        (["runs", "--limit", "0"], "argument --limit: expected a whole number from 1 to 1000"),
        (["runs", "--status", "done"], "argument --status: invalid choice: 'done'"),
        (["submit", "-p", "d", "--wait", "--wait-timeout", "-1", "x"], "above 0, got '-1'"),
        (["accounts", "rest"], "argument end-rest: invalid choice: 'rest'"),
        (["worktrees", "prune"], "argument sweep: invalid choice: 'prune'"),
        (["sim", "diff", "a"], "herdsman sim diff: the following arguments are required: B"),
        (["check", "--bogus"], "herdsman: unrecognized arguments: --bogus"),
        (["nope"], "argument COMMAND: invalid choice: 'nope'"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    _, err = capsys.readouterr()
    assert said in err
    assert err.count("\n") == 1
    assert err.rstrip().endswith("--help`)")


def test_the_status_filter_offers_every_run_status() -> None:
    assert tuple(status.value for status in RunStatus) == RUN_STATUSES


def test_a_plain_table_is_one_row_a_line_and_cuts_nothing() -> None:
    columns = [Column("id"), Column("n", align="right"), Column("reason")]
    rows = [["run-1", "3", "it failed:\ncannot start"], ["a-much-longer-id", "12", ""]]
    assert plain_table(columns, rows) == (
        "id                 n  reason\n"
        "run-1              3  it failed: cannot start\n"
        "a-much-longer-id  12  -\n"
    )


def test_durations_read_as_they_sort() -> None:
    assert [duration_text(s) for s in (0.04, 59.94, 60, 185, 3599.6, 7380)] == [
        "0.0s",
        "59.9s",
        "1m00s",
        "3m05s",
        "1h00m",
        "2h03m",
    ]


@pytest.mark.parametrize(
    ("argv", "moved"),
    [
        (["-c", "nope.toml", "status"], "status -c nope.toml"),
        (["--config=my.toml", "runs", "--json"], "runs --json --config=my.toml"),
        (["-cmy.toml", "check"], "check -cmy.toml"),
        (["--set", "api.listen=127.0.0.1:1", "check"], "check --set api.listen=127.0.0.1:1"),
    ],
)
def test_an_option_written_before_the_command_is_one_line_saying_where_it_goes(
    argv: list[str], moved: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"herdsman: {argv[0]}")
    assert f"put it after the command's name, e.g. `herdsman {moved}`" in error
    assert len(error.splitlines()) == 1


def test_the_moved_option_is_read_where_the_error_puts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "my.toml"
    config.write_text('[providers.demo]\nexec = ["herdsman-demo-agent"]\n', encoding="utf-8")
    assert main(["-c", str(config), "config", "get", "providers.demo.concurrency"]) == 2
    suggested = capsys.readouterr().err.split("e.g. `herdsman ")[1].split("`")[0]
    assert main(suggested.split(" ")) == 0
    assert capsys.readouterr().out == "1\n"
