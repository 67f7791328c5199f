"""What a reload reports: every changed key, applied or waiting for a restart."""

from __future__ import annotations

from herdsman.runtime.reload import RESTART_KEYS, Change, ReloadResult, diff_settings


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
