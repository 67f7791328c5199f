"""Valid files: normalised values, defaults, path resolution and origins."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from herdsman.config import Account, LoadedConfig, Origin, Provider, Repo

Load = Callable[..., LoadedConfig]
MINIMAL = '[providers.claude]\nexec = ["claude", "-p"]\n'


def test_defaults_apply_and_are_marked_default(load: Load) -> None:
    loaded = load(MINIMAL, environ={"XDG_STATE_HOME": "/var/state"})
    config = loaded.config
    assert config.supervisor.state_dir == Path("/var/state/herdsman")
    assert config.supervisor.max_concurrency is None
    assert config.supervisor.shutdown_grace == timedelta(minutes=10)
    assert config.scheduling.agent_exclusive is True
    assert config.providers == {
        "claude": Provider(
            exec=("claude", "-p"),
            concurrency=1,
            timeout=None,
            idle_timeout=timedelta(minutes=15),
            env={},
            protocol="plain",
            workdir=Path("/var/state/herdsman/workspace"),
            usage_limit_pattern=None,
            accounts=(),
        )
    }
    assert config.repos == ()
    assert config.retention.idle == timedelta(days=14)
    assert config.retention.sweep_interval == timedelta(hours=1)
    assert (config.api.listen, config.api.host, config.api.port) == (
        "127.0.0.1:7878",
        "127.0.0.1",
        7878,
    )
    assert config.api.token_file == Path("/var/state/herdsman/api-token")
    assert config.trace.enabled is True
    assert config.trace.dir == Path("/var/state/herdsman/traces")
    assert config.trace.max_bytes == 268_435_456
    assert config.store.url is None
    assert loaded.origins["providers.claude.exec"] == Origin("file", str(loaded.path), 2)
    assert str(loaded.origins["providers.claude.exec"]).endswith("supervisor.toml:2")
    assert loaded.origins["providers.claude.concurrency"] == Origin("default")
    assert str(loaded.origins["trace.dir"]) == "default"
    # Defaults under state_dir follow it when it is set.
    moved = load(MINIMAL + '[supervisor]\nstate_dir = "/srv/h"\n', environ={}).config
    assert moved.api.token_file == Path("/srv/h/api-token")
    assert moved.providers["claude"].workdir == Path("/srv/h/workspace")
    assert moved.trace.dir == Path("/srv/h/traces")


def test_state_dir_falls_back_to_home_when_xdg_is_unset_or_relative(
    load: Load, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for environ in ({}, {"XDG_STATE_HOME": "relative/state"}):
        loaded = load(MINIMAL, environ=environ)
        assert loaded.config.supervisor.state_dir == tmp_path / ".local/state/herdsman"


def test_paths_resolve_against_the_config_folder_and_expand_home(
    load: Load, config_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    loaded = load(
        '[supervisor]\nstate_dir = "state"\n'
        + MINIMAL
        + 'workdir = "~/work"\n[[repos]]\nname = "r"\npath = "."\n'
        + '[api]\ntoken_file = "/etc/token"\n'
    )
    config = loaded.config
    assert config.supervisor.state_dir == config_path.parent / "state"
    assert config.trace.dir == config_path.parent / "state" / "traces"
    assert config.providers["claude"].workdir == Path("/home/u/work")
    assert config.repos == (Repo(name="r", path=config_path.parent),)
    assert config.api.token_file == Path("/etc/token")


def test_durations_and_zero_meaning_none(load: Load) -> None:
    loaded = load(
        MINIMAL
        + 'timeout = "1h30m"\nidle_timeout = "0"\n'
        + '[supervisor]\nshutdown_grace = "0"\n[retention]\nidle = "2d"\nsweep_interval = "90s"\n'
    )
    provider = loaded.config.providers["claude"]
    assert provider.timeout == timedelta(hours=1, minutes=30)
    assert provider.idle_timeout is None
    assert loaded.toml_values["providers.claude.idle_timeout"] == "0"
    assert loaded.config.supervisor.shutdown_grace == timedelta(0)
    assert loaded.config.retention.idle == timedelta(days=2)
    assert loaded.config.retention.sweep_interval == timedelta(seconds=90)


def test_accounts_and_provider_settings(load: Load) -> None:
    loaded = load(
        MINIMAL
        + 'protocol = "claude"\nconcurrency = 64\nusage_limit_pattern = "(?i)limit"\n'
        + 'env = { A = "1" }\n'
        + '[[providers.claude.accounts]]\nname = "work.1"\nwindow = "5h"\nbudget = 40\n'
        + 'budget_unit = "run_minutes"\nconcurrency = 2\nenv = { B = "2" }\n'
        + '[[providers.claude.accounts]]\nname = "spare"\n'
    )
    provider = loaded.config.providers["claude"]
    assert (provider.protocol, provider.concurrency) == ("claude", 64)
    assert provider.usage_limit_pattern == "(?i)limit"
    assert provider.env == {"A": "1"}
    assert provider.accounts == (
        Account(
            name="work.1",
            env={"B": "2"},
            window=timedelta(hours=5),
            budget=40,
            budget_unit="run_minutes",
            concurrency=2,
        ),
        Account(
            name="spare", env={}, window=None, budget=None, budget_unit="runs", concurrency=None
        ),
    )
    assert loaded.origins["providers.claude.accounts[0].budget"] == Origin(
        "file", str(loaded.path), 10
    )


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("[::1]:7878", "::1", 7878),
        ("0.0.0.0:1", "0.0.0.0", 1),
        ("example.org:65535", "example.org", 65535),
    ],
)
def test_listen_addresses(load: Load, listen: str, host: str, port: int) -> None:
    api = load(MINIMAL + f'[api]\nlisten = "{listen}"\n').config.api
    assert (api.host, api.port) == (host, port)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://herdsman@db.example:5432/herdsman",
        "postgres://db.example/herdsman",
        "postgresql://[::1]/herdsman?sslmode=require&options=-csearch_path%3Dherdsman",
        "postgresql:///herdsman?host=/var/run/postgresql",
        "postgresql://db1:5432,db2:5433/herdsman?target_session_attrs=read-write",
    ],
)
def test_store_urls_libpq_accepts_are_kept_as_written(load: Load, url: str) -> None:
    loaded = load(MINIMAL + f'[store]\nurl = "{url}"\n')
    assert loaded.config.store.url == url
    assert loaded.toml_values["store.url"] == url


def test_the_model_is_frozen(load: Load) -> None:
    import attrs

    config = load(MINIMAL).config
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.supervisor.max_concurrency = 3  # type: ignore[misc]


def test_a_user_written_value_is_never_replaced_by_its_default(load: Load) -> None:
    loaded = load(MINIMAL + "concurrency = 1\n")
    assert loaded.origins["providers.claude.concurrency"].kind == "file"


def test_environment_warnings_for_a_missing_repo_and_binary(load: Load, tmp_path: Path) -> None:
    from herdsman.config import environment_warnings

    loaded = load(
        '[providers.x]\nexec = ["/nonexistent/agent"]\n[[repos]]\nname = "gone"\npath = "gone"\n'
    )
    assert [w.split(": ", 1)[1] for w in environment_warnings(loaded)] == [
        "providers.x.exec: '/nonexistent/agent' does not exist or is not executable",
        f"repos[0].path: {tmp_path / 'gone'} is not a directory",
    ]


def test_no_environment_warnings_for_a_present_binary_and_git_checkout(
    load: Load, tmp_path: Path
) -> None:
    import subprocess
    import sys

    from herdsman.config import environment_warnings

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    loaded = load(
        f'[providers.py]\nexec = ["{sys.executable}"]\n[[repos]]\nname = "r"\npath = "."\n'
    )
    assert environment_warnings(loaded) == []


def test_environment_warnings_for_a_tilde_no_shell_will_expand(load: Load) -> None:
    import sys

    from herdsman.config import environment_warnings

    loaded = load(
        f'[providers.x]\nexec = ["{sys.executable}"]\nenv = {{ HOME_DIR = "/" }}\n'
        '[[providers.x.accounts]]\nname = "a"\nenv = { CLAUDE_CONFIG_DIR = "~/.claude-a" }\n'
    )
    assert [w.split(": ", 1)[1] for w in environment_warnings(loaded)] == [
        "providers.x.accounts[0].env.CLAUDE_CONFIG_DIR: '~/.claude-a' starts with '~', which"
        " nothing expands (no shell runs the command); write the full path"
    ]


def test_environment_warnings_for_a_path_that_does_not_exist(load: Load, tmp_path: Path) -> None:
    import sys

    from herdsman.config import environment_warnings

    (tmp_path / "made").mkdir()
    loaded = load(
        f'[providers.x]\nexec = ["{sys.executable}"]\n'
        f'env = {{ CODEX_HOME = "{tmp_path / "codex"}", MADE = "{tmp_path / "made"}", '
        'SEARCH = "/nonexistent-a:/nonexistent-b", FLAG = "1", WORD = "nonexistent" }\n'
        '[[providers.x.accounts]]\nname = "work"\n'
        'env = { CLAUDE_CONFIG_DIR = "/home/you/.claude-work" }\n'
    )
    hint = (
        "does not exist; runs would find nothing there (a CLI's config folder starts logged"
        " out: log in with this variable set first, or fix the path)"
    )
    assert [w.split(": ", 1)[1] for w in environment_warnings(loaded)] == [
        f"providers.x.env.CODEX_HOME: {tmp_path / 'codex'} {hint}",
        f"providers.x.accounts[0].env.CLAUDE_CONFIG_DIR: /home/you/.claude-work {hint}",
    ]
    # Each names the file and line it was written on.
    assert [w.split(": ", 1)[0] for w in environment_warnings(loaded)] == [
        f"{tmp_path / 'supervisor.toml'}:3",
        f"{tmp_path / 'supervisor.toml'}:6",
    ]


def test_a_duration_too_long_to_hold_is_an_error_not_a_crash(load: Load) -> None:
    from herdsman.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        load(MINIMAL + 'timeout = "99999999999999999999d"\n')
    [problem] = caught.value.problems
    assert problem.message == 'must be at most 36500d, got "99999999999999999999d"'


def test_a_home_folder_of_an_unknown_user_is_an_error_not_a_crash(load: Load) -> None:
    from herdsman.config import ConfigError

    with pytest.raises(ConfigError) as caught:
        load('[supervisor]\nstate_dir = "~nosuchuser-herdsman/x"\n' + MINIMAL)
    [problem] = caught.value.problems
    assert problem.key_path == "supervisor.state_dir"
    assert "there is no user 'nosuchuser-herdsman' here" in problem.message


@pytest.mark.parametrize(
    ("unit", "written", "read"),
    [
        ("runs", "60", 60),
        ("tokens", "5e6", 5_000_000),
        ("tokens", "5_000_000", 5_000_000),
        ("usd", "20.50", 20.5),
        ("usd", "20", 20),
    ],
)
def test_a_budget_reads_as_written_in_its_unit(
    load: Load, unit: str, written: str, read: float
) -> None:
    account = f'[[providers.claude.accounts]]\nname = "a"\nwindow = "5h"\nbudget = {written}\n'
    text = MINIMAL + 'protocol = "claude"\n' + account + f'budget_unit = "{unit}"\n'
    [parsed] = load(text).config.providers["claude"].accounts
    assert parsed.budget == read
    # A whole number stays one (the trace's copy of the configuration shows 60, not 60.0).
    assert type(parsed.budget) is type(read)
