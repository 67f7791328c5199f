# ruff: noqa: E501  -- expected error lines are kept whole, as users see them.
"""The real ``herdsman`` command on real files, in a subprocess."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from herdsman.executables import scripts_dir

ROOT = Path(__file__).resolve().parents[2]
VALID = """\
# my supervisor
[providers.claude]   # main
exec = ["claude", "-p"]
concurrency = 2 # low

[[repos]]
name = "here"
path = "."
"""


def herdsman(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "XDG_STATE_HOME": str(cwd / "state"),
        "XDG_CONFIG_HOME": str(cwd / "xdg"),
    }
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "herdsman", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "supervisor.toml").write_text(VALID)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def test_check_valid_file(workdir: Path) -> None:
    result = herdsman("check", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == "supervisor.toml: valid"
    assert any(line.split() == ["concurrency", "2", "supervisor.toml:4"] for line in lines)
    assert any(line.split() == ["idle_timeout", "15m", "default"] for line in lines)
    assert any(
        line.split() == ["state_dir", str(workdir / "state/herdsman"), "default"] for line in lines
    )
    # claude is not installed here; the repo is a git checkout, so no warning for it.
    assert [line for line in lines if "warn" in line or "PATH" in line or "git" in line] == [
        "warnings:",
        "  supervisor.toml:3: providers.claude.exec: 'claude' was not found on PATH "
        f"nor in {scripts_dir()}",
    ]


def test_check_invalid_file_lists_every_error_and_exits_1(workdir: Path) -> None:
    (workdir / "supervisor.toml").write_text(
        VALID.replace("concurrency = 2", "concurency = 2\ntimeout = 5") + '[api]\nlisten = "x"\n'
    )
    result = herdsman("check", cwd=workdir)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "supervisor.toml:4:1: providers.claude.concurency: unknown key; did you mean 'concurrency'?",
        'supervisor.toml:5:11: providers.claude.timeout: must be a duration such as "90s", "15m", '
        '"1h30m", "14d" or "0", got 5',
        "supervisor.toml:11:10: api.listen: must be HOST:PORT with a port from 1 to 65535, "
        'e.g. "127.0.0.1:7878" or "[::1]:7878", got "x"',
    ]
    assert "Traceback" not in result.stderr


def test_check_json(workdir: Path) -> None:
    result = herdsman("check", "--json", "--set", "providers.claude.timeout=1h", cwd=workdir)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["valid"] is True
    assert document["errors"] == []
    assert document["config"]["values"]["providers"]["claude"]["timeout"] == "1h"
    assert document["config"]["origins"]["providers.claude.timeout"] == "--set"
    assert document["config"]["origins"]["providers.claude.concurrency"] == "supervisor.toml:4"
    assert document["config"]["values"]["repos"] == [{"name": "here", "path": str(workdir)}]
    assert document["warnings"] == [
        "supervisor.toml:3: providers.claude.exec: 'claude' was not found on PATH "
        f"nor in {scripts_dir()}"
    ]


def test_check_json_invalid(workdir: Path) -> None:
    result = herdsman("check", "--json", "--set", "providers.claude.concurrency=0", cwd=workdir)
    assert result.returncode == 1
    document = json.loads(result.stdout)
    assert document["valid"] is False
    assert document["config"] is None
    assert [error["text"] for error in document["errors"]] == [
        "--set providers.claude.concurrency=0: providers.claude.concurrency: "
        "must be a whole number from 1 to 64, got 0"
    ]


def test_repo_that_is_not_a_git_checkout_warns(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "supervisor.toml").write_text(VALID.replace('path = "."', 'path = "plain"'))
    result = herdsman("check", cwd=tmp_path)
    assert result.returncode == 0
    assert f"  supervisor.toml:8: repos[0].path: {tmp_path / 'plain'} is not a git checkout" in (
        result.stdout.splitlines()
    )


def test_missing_config_is_one_line(tmp_path: Path) -> None:
    result = herdsman("check", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == (
        "no configuration file found (looked at -c FILE, $HERDSMAN_CONFIG, supervisor.toml, "
        f"{tmp_path / 'xdg/herdsman/supervisor.toml'}); "
        "pass -c FILE or copy supervisor.toml.example to one of those places\n"
    )
    named = herdsman("check", "-c", "nope.toml", cwd=tmp_path)
    assert (named.returncode, named.stderr) == (
        1,
        "nope.toml: cannot read file: No such file or directory\n",
    )


def test_config_file_from_environment(workdir: Path) -> None:
    other = workdir / "other.toml"
    other.write_text(VALID.replace("concurrency = 2", "concurrency = 9"))
    result = herdsman(
        "config",
        "get",
        "providers.claude.concurrency",
        cwd=workdir,
        env={"HERDSMAN_CONFIG": str(other)},
    )
    assert (result.returncode, result.stdout) == (0, "9\n")


def test_usage_errors_exit_2(workdir: Path) -> None:
    assert herdsman("check", "--bogus", cwd=workdir).returncode == 2
    assert herdsman(cwd=workdir).returncode == 2
    assert herdsman("config", "get", cwd=workdir).returncode == 2


def test_config_get(workdir: Path) -> None:
    got = herdsman("config", "get", "providers.claude.exec", cwd=workdir)
    assert (got.returncode, got.stdout, got.stderr) == (0, '["claude", "-p"]\n', "")
    default = herdsman("config", "get", "providers.claude.idle_timeout", cwd=workdir)
    assert (default.returncode, default.stdout) == (0, '"15m"\n')
    assert (
        default.stderr
        == "providers.claude.idle_timeout: not set in supervisor.toml; this is the default\n"
    )
    override = herdsman(
        "config",
        "get",
        "providers.claude.concurrency",
        "--set",
        "providers.claude.concurrency=5",
        cwd=workdir,
    )
    assert (override.returncode, override.stdout) == (0, "5\n")
    unknown = herdsman("config", "get", "providers.claude.concurency", cwd=workdir)
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert (
        unknown.stderr == "providers.claude.concurency: unknown key; did you mean 'concurrency'?\n"
    )


def test_config_set_changes_only_the_value_and_keeps_mode(workdir: Path) -> None:
    path = workdir / "supervisor.toml"
    path.chmod(0o600)
    result = herdsman("config", "set", "providers.claude.concurrency", "7", cwd=workdir)
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (
        "providers.claude.concurrency = 7  (supervisor.toml)\n"
        "no supervisor is running on this file; the change applies when one starts\n"
    )
    quiet = herdsman(
        "config", "set", "providers.claude.concurrency", "6", "--no-reload", cwd=workdir
    )
    assert quiet.stdout == "providers.claude.concurrency = 6  (supervisor.toml)\n"
    result = herdsman(
        "config", "set", "providers.claude.concurrency", "7", "--no-reload", cwd=workdir
    )
    assert path.read_text() == VALID.replace("concurrency = 2 # low", "concurrency = 7 # low")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Setting what the file already says changes nothing, and no reload is reported.
    again = herdsman("config", "set", "providers.claude.concurrency", "7", cwd=workdir)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == (
        "providers.claude.concurrency = 7  (supervisor.toml)\n"
        "supervisor.toml already said so; nothing changed, nothing to reload\n"
    )
    assert path.read_text() == VALID.replace("concurrency = 2 # low", "concurrency = 7 # low")
    timeout = herdsman(
        "config", "set", "providers.claude.timeout", "15m", "-c", str(path), cwd=workdir
    )
    assert timeout.returncode == 0, timeout.stderr
    assert herdsman("config", "get", "providers.claude.timeout", cwd=workdir).stdout == '"15m"\n'


def test_config_set_refuses_an_invalid_edit(workdir: Path) -> None:
    path = workdir / "supervisor.toml"
    before = path.read_bytes()
    result = herdsman("config", "set", "providers.claude.concurrency", "65", cwd=workdir)
    assert result.returncode == 1
    assert result.stderr == (
        "supervisor.toml:4:15: providers.claude.concurrency: must be a whole number from 1 to 64, got 65\n"
    )
    assert path.read_bytes() == before
    assert sorted(p.name for p in workdir.iterdir()) == [".git", "supervisor.toml"]


def test_config_get_add_and_remove_arrays_of_tables(workdir: Path) -> None:
    path = workdir / "supervisor.toml"
    got = herdsman("config", "get", "repos", cwd=workdir)
    assert (got.returncode, got.stderr) == (0, "")
    assert got.stdout == f'[[repos]]\nname = "here"\npath = "{workdir}"\n'
    added = herdsman("config", "add", "repos", "name=app", "path=/src/app", cwd=workdir)
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines()[0] == "added repos[1]  (supervisor.toml)"
    # Written (it is valid), and what `check` would warn about it said at once.
    assert (
        added.stderr == "warning: supervisor.toml:12: repos[1].path: /src/app is not a directory\n"
    )
    moved = herdsman("config", "set", "repos[1].path", str(workdir), "--no-reload", cwd=workdir)
    assert (moved.returncode, moved.stderr) == (0, "")
    back = herdsman("config", "set", "repos[1].path", "/src/app", "--no-reload", cwd=workdir)
    assert (
        back.stderr == "warning: supervisor.toml:12: repos[1].path: /src/app is not a directory\n"
    )
    assert path.read_text() == VALID + '\n[[repos]]\nname = "app"\npath = "/src/app"\n'
    as_json = json.loads(herdsman("config", "get", "repos[1]", "--json", cwd=workdir).stdout)
    assert as_json == {
        "key": "repos[1]",
        "value": {"name": "app", "path": "/src/app"},
        "origins": {"repos[1].name": "supervisor.toml:11", "repos[1].path": "supervisor.toml:12"},
    }
    removed = herdsman("config", "remove", "repos[0]", "--no-reload", cwd=workdir)
    assert removed.stdout == "removed repos[0]  (supervisor.toml)\n"
    assert path.read_text() == VALID.replace(
        'name = "here"\npath = "."', 'name = "app"\npath = "/src/app"'
    )


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (
            ("set", "providers.claud.concurrency", "3"),
            2,
            "providers.claud: not in supervisor.toml; did you mean 'claude'? "
            "(to add a new one, set providers.claud.exec first)",
        ),
        (("remove", "repos[4]"), 2, "repos has no element [4]; it has 1 ([0])"),
        (("add", "repos", "nam=x"), 2, "repos[1].nam: unknown key; did you mean 'name'?"),
        (("add", "repos", "name"), 2, "'name' must be KEY=VALUE, e.g. name=app or path=~/src/app"),
        (
            ("add", "repos", "name=here", "path=/x"),
            1,
            'supervisor.toml:11:8: repos[1].name: duplicate name "here"; already used by'
            " repos[0].name (supervisor.toml:7:8); names must be unique",
        ),
        (
            ("remove", "providers.claude.exec"),
            1,
            "supervisor.toml:2:1: providers.claude: missing required key 'exec'",
        ),
    ],
)
def test_refused_edits_exit_2_for_usage_1_for_an_invalid_file(
    workdir: Path, args: tuple[str, ...], status: int, message: str
) -> None:
    path = workdir / "supervisor.toml"
    before = path.read_bytes()
    result = herdsman("config", *args, cwd=workdir)
    assert (result.returncode, result.stdout) == (status, "")
    assert result.stderr.startswith(message), result.stderr
    assert path.read_bytes() == before


def test_sim_plan_vary_names_the_provider_it_meant(tmp_path: Path) -> None:
    workload = ROOT / "sim" / "team-day.jsonl"
    result = herdsman(
        "sim",
        "plan",
        str(workload),
        "--vary",
        "providers.claud.concurrency=1..2",
        "--slo",
        "p95_wait<=10m",
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "providers.claud: not in the configuration; did you mean 'claude'?" in result.stderr
