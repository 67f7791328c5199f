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


def test_a_key_set_to_nothing_is_a_change_too() -> None:
    assert diff_settings({"k": None}, {"k": None}) == []
    assert diff_settings({}, {"k": None}) == [Change("k", None, None, live=True)]


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
    assert live.as_json()["changes"] == [{"key": "k", "old": "1", "new": "2", "applied": True}]
    rejected = ReloadResult(False, 2, "SIGHUP", 0.0, errors=("f:1:1: k: bad",))
    assert not rejected.applied
    assert rejected.as_json()["errors"] == ["f:1:1: k: bad"]
