"""Reset-time parsing edge cases, and what ProcessSpec refuses."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from herdsman.runtime.runner.spec import Outcome, OwnedEnv, ProcessSpec
from herdsman.runtime.runner.usage import parse_claude_reset, parse_codex_reset

LATE = datetime(2026, 4, 1, 21, 0, tzinfo=UTC).timestamp()  # 23:00 in Berlin


def test_a_reset_time_already_past_today_means_tomorrow() -> None:
    assert parse_claude_reset("resets 8pm (Europe/Berlin)", LATE) == (
        datetime(2026, 4, 2, 18, 0, tzinfo=UTC).timestamp()
    )


def test_a_date_without_year_that_passed_means_next_year() -> None:
    assert parse_claude_reset("resets Jan 2 at 9am (UTC)", LATE) == (
        datetime(2027, 1, 2, 9, 0, tzinfo=UTC).timestamp()
    )


@pytest.mark.parametrize(
    "text",
    ["You've hit your limit", "resets 13pm (UTC)", "resets Feb 30 at 1am (UTC)", ""],
)
def test_unreadable_claude_resets_give_none(text: str) -> None:
    assert parse_claude_reset(text, LATE) is None


def test_codex_resets_in_seconds_field_and_unreadable_text() -> None:
    assert parse_codex_reset('{"resets_in_seconds": 60}', LATE) == LATE + 60
    assert parse_codex_reset("You've hit your usage limit.", LATE) is None
    assert parse_codex_reset("try again in 1 hour and 30 minutes", LATE) == LATE + 5400


def _spec(**overrides: Any) -> ProcessSpec:
    fields: dict[str, Any] = {
        "argv": ["agent"],
        "env": {},
        "cwd": "/tmp",
        "prompt": "",
        "timeout": None,
        "idle_timeout": None,
        "log_path": "/tmp/x.log",
        "protocol": "plain",
    }
    fields.update(overrides)
    return ProcessSpec(**fields)


def test_spec_converts_and_snapshots_its_fields() -> None:
    env = {"A": "1"}
    spec = _spec(env=env)
    env["B"] = "2"
    assert dict(spec.env) == {"A": "1"}
    assert spec.argv == ("agent",)
    assert spec.cwd == Path("/tmp")
    assert spec.kill_grace == 5.0


def test_spec_keeps_its_log_path_as_a_string() -> None:
    # The supervisor passes a string per run; making it a Path cost more
    # than building the rest of the spec.
    given = "/tmp/x.log"
    assert _spec(log_path=given).log_file is given
    from_path = _spec(log_path=Path("/tmp/y.log"))
    assert from_path.log_file == "/tmp/y.log"
    assert from_path.log_path == Path("/tmp/y.log")


def test_spec_takes_an_owned_env_without_copying_it() -> None:
    # launch.SpecBuilder hands each run's fresh environment over as an
    # OwnedEnv: copying it again would be a second copy per run for nothing.
    owned = OwnedEnv(A="1")
    spec = _spec(env=owned)
    owned["B"] = "2"  # what an owner must never do: it shows that no copy was made
    assert dict(spec.env) == {"A": "1", "B": "2"}
    with pytest.raises(TypeError):
        spec.env["C"] = "3"  # type: ignore[index]  # still read-only through the spec


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"argv": []}, "argv must name a program"),
        ({"timeout": 0}, "timeout must be positive"),
        ({"idle_timeout": -1.0}, "idle_timeout must be positive"),
        ({"kill_grace": -1.0}, "kill_grace must be >= 0"),
        ({"usage_limit_pattern": "("}, "usage_limit_pattern is not a valid regular"),
        ({"protocol": "gemini"}, "'protocol' must be in"),
    ],
)
def test_spec_refuses_invalid_values(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _spec(**overrides)


def test_spec_refuses_a_single_string_as_argv() -> None:
    with pytest.raises(TypeError, match="argv must be a sequence of strings"):
        _spec(argv="claude -p")


def test_outcome_values_equal_the_store_statuses() -> None:
    assert [o.value for o in Outcome] == ["succeeded", "failed", "timed_out", "cancelled"]


def test_every_outcome_is_a_store_status() -> None:
    from herdsman.runtime.store.records import RunStatus

    assert all(RunStatus(outcome.value).value == outcome.value for outcome in Outcome)
