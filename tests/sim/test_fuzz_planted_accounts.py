"""The fuzzer finds bugs planted in budgets, logins and retries, and names what they break.

Each plant (``planted_accounts``) breaks one rule of docs/accounts.md or
docs/operations.md ("Retries"); the batch of seeds must stop at a seed
whose first violation names the invariant the rule keeps. One plant goes
the whole way a developer would: the reproduction line, a minimised case
file, and its replay, which passes once the bug is gone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import planted_accounts
import pytest
from test_fuzz_planted import _fuzz_finds, _replays

from herdsman.sim.fuzz.campaign import fuzz_seeds

#: The seeds each plant is hunted over: the batch stops at the first that fails.
SEEDS = 40


@pytest.mark.parametrize(
    ("plant", "kind"),
    [
        (planted_accounts.estimate_nothing, "budget"),
        (planted_accounts.forget_logins, "needs login"),
        (planted_accounts.retry_past_attempts, "retry attempts"),
        (planted_accounts.retry_after_any_work, "retry after work"),
        (planted_accounts.release_lanes_in_backoff, "retry order"),
    ],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_a_planted_bug_is_found_and_named(
    plant: Callable[[pytest.MonkeyPatch], None], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(monkeypatch)
    batch = fuzz_seeds(range(SEEDS))
    assert batch.failure is not None, f"{plant.__name__}: every invariant held"
    assert batch.failure.violations[0].kind == kind, str(batch.failure.violations[0])


def test_a_retry_of_a_class_not_in_on_is_found_minimised_and_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    planted_accounts.retry_any_class(monkeypatch)
    case = _fuzz_finds(tmp_path, capsys, "retry class")
    events = json.loads(case.read_text())["fuzz"]["events"]
    # The case file holds what the agents said, and reads back as written.
    assert any("failure" in a for e in events if e["kind"] == "submit" for a in e["attempts"])
    code, err = _replays(case, capsys)
    assert code == 1
    assert ": retry class: " in err
    monkeypatch.undo()
    code, err = _replays(case, capsys)
    assert code == 0
    assert err.endswith("every invariant held\n")
