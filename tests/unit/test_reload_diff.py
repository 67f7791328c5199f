"""What a reload reports: every changed key, applied or waiting for a restart."""

from __future__ import annotations

from pathlib import Path

from herdsman.config import LoadedConfig, load_config_text
from herdsman.config.model import RESTART_FIELDS
from herdsman.runtime.reload import (
    RESTART_KEYS,
    Change,
    ReloadResult,
    diff_settings,
    given_config,
)


def test_changes_come_in_the_new_files_order_then_removed_keys() -> None:
    old = {"a.x": 1, "a.y": [1], "gone.z": "q", "api.listen": "127.0.0.1:1"}
    new = {"a.y": [1, 2], "a.x": 1, "b.new": True, "api.listen": "127.0.0.1:2"}
    assert diff_settings(old, new) == [
        Change("a.y", [1], [1, 2], live=True),
        Change("b.new", None, True, live=True),
        Change("api.listen", "127.0.0.1:1", "127.0.0.1:2", live=False),
        Change("gone.z", "q", None, live=True),
    ]


def test_a_new_key_left_unset_is_no_change() -> None:
    assert diff_settings({"k": None}, {"k": None}) == []
    assert diff_settings({}, {"k": None}) == []
    assert diff_settings({"k": 1}, {}) == [Change("k", 1, None, live=True)]


def test_environment_values_never_show_in_a_report() -> None:
    [change] = diff_settings(
        {"providers.p.accounts[0].env": {"TOKEN": "old-secret"}},
        {"providers.p.accounts[0].env": {"TOKEN": "new-secret", "HOME": "/h"}},
    )
    shown = change.describe() + str(change.as_json())
    assert "secret" not in shown
    assert "/h" not in shown
    assert 'TOKEN = "***"' in shown


def test_every_restart_key_is_reported_as_kept() -> None:
    for key in RESTART_KEYS:
        [change] = diff_settings({key: "old"}, {key: "new"})
        assert not change.live
        assert change.describe() == (
            f'{key}: "old" -> "new" (needs a restart; the running value is kept)'
        )


def test_a_result_is_applied_only_when_a_live_change_was_made() -> None:
    restart_only = ReloadResult(True, 1, "API", 0.0, (Change("api.listen", "a", "b", False),))
    assert not restart_only.applied
    live = ReloadResult(True, 2, "API", 0.0, (Change("k", 1, 2, True),))
    assert live.applied
    assert live.as_json()["changes"] == [
        {"key": "k", "change": "changed", "old": "1", "new": "2", "applied": True}
    ]
    rejected = ReloadResult(False, 2, "SIGHUP", 0.0, errors=("f:1:1: k: bad",))
    assert not rejected.applied
    assert rejected.as_json()["errors"] == ["f:1:1: k: bad"]


def test_accounts_and_repos_are_matched_by_name_not_by_place() -> None:
    old = {
        "providers.p.accounts[0].name": "a",
        "providers.p.accounts[0].concurrency": 1,
        "providers.p.accounts[1].name": "b",
        "providers.p.accounts[1].concurrency": 2,
        "repos[0].name": "app",
        "repos[0].path": "/app",
    }
    new = {
        "providers.p.accounts[0].name": "b",
        "providers.p.accounts[0].concurrency": 2,
        "repos[0].name": "app",
        "repos[0].path": "/app",
    }
    assert diff_settings(old, new) == [
        Change("providers.p.accounts[a]", None, None, live=True, kind="removed"),
    ]


PROVIDER = {
    "providers.echo.exec": ["echo"],
    "providers.echo.concurrency": 1,
    "providers.echo.usage_limit_pattern": None,
    "providers.echo.accounts[0].name": "one",
    "providers.echo.accounts[0].concurrency": None,
}


def test_a_provider_added_or_removed_is_one_line() -> None:
    base = {"supervisor.max_concurrency": 4}
    [added] = diff_settings(base, base | PROVIDER)
    assert added.describe() == "providers.echo: added (applied)"
    assert added.as_json() == {
        "key": "providers.echo",
        "change": "added",
        "old": "(not set)",
        "new": "(table)",
        "applied": True,
    }
    [removed] = diff_settings(base | PROVIDER, base)
    assert removed.describe() == "providers.echo: removed (applied)"


def test_an_account_or_repo_added_or_removed_is_one_line() -> None:
    base = PROVIDER | {"repos[0].name": "app", "repos[0].path": "/app"}
    more = base | {
        "providers.echo.accounts[1].name": "two",
        "providers.echo.accounts[1].concurrency": 2,
        "repos[1].name": "lib",
        "repos[1].path": "/lib",
    }
    assert [c.describe() for c in diff_settings(base, more)] == [
        "providers.echo.accounts[two]: added (applied)",
        "repos[lib]: added (applied)",
    ]
    assert [c.describe() for c in diff_settings(more, base)] == [
        "providers.echo.accounts[two]: removed (applied)",
        "repos[lib]: removed (applied)",
    ]


def test_a_setting_that_was_unset_and_is_gone_is_no_change() -> None:
    assert diff_settings({"a.k": None, "a.j": 1}, {"a.j": 1}) == []


def test_a_reload_keeps_the_running_value_of_every_restart_setting_and_applies_the_rest(
    tmp_path: Path,
) -> None:
    def loaded(port: int, concurrency: int, state: str) -> LoadedConfig:
        text = f"""\
[supervisor]
state_dir = "{tmp_path / state}"
[store]
url = "postgresql://herdsman@db{port}.example/herdsman"
[fleet]
enabled = {"true" if port == 1 else "false"}
[providers.demo]
exec = ["demo"]
concurrency = {concurrency}
[api]
listen = "127.0.0.1:{port}"
token_file = "{tmp_path / state / "token"}"
[trace]
enabled = {"true" if port == 1 else "false"}
dir = "{tmp_path / state / "traces"}"
max_bytes = {4096 * port}
"""
        return load_config_text(text, tmp_path / "supervisor.toml", environ={})

    running, written = loaded(1, 1, "a"), loaded(2, 3, "b")
    kept, changes = given_config(written, running)
    for table, names in RESTART_FIELDS.items():
        for name in names:
            assert getattr(getattr(kept.config, table), name) == getattr(
                getattr(running.config, table), name
            ), f"{table}.{name}"
            assert getattr(getattr(written.config, table), name) != getattr(
                getattr(running.config, table), name
            ), f"the test changes {table}.{name}"
    assert kept.config.providers["demo"].concurrency == 3
    assert {c.key for c in changes if not c.live} == set(RESTART_KEYS)


def test_the_configuration_guide_lists_exactly_the_restart_settings() -> None:
    guide = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    [row] = [line for line in guide.read_text().splitlines() if "**need a restart**" in line]
    listed = row.split("|")[1]
    assert {key.strip("` ") for key in listed.split(",")} == set(RESTART_KEYS)
