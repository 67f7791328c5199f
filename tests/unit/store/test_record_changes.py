"""The fast record copy every store's state changes use is ``attrs.evolve``, exactly."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.store.records import RunRecord, RunStatus, _changed

BASE = RunRecord(
    id="r1",
    provider="p",
    prompt="hello",
    conversation="c",
    agent=None,
    workspace="default",
    callback_url=None,
    metadata={"k": 1},
    seq=3,
    status=RunStatus.QUEUED,
    submitted_at=10.0,
    notes=("first",),
)

optional_text = st.none() | st.text(max_size=5)
optional_time = st.none() | st.floats(allow_nan=False, allow_infinity=False)
CHANGES: dict[str, st.SearchStrategy[Any]] = {
    "status": st.sampled_from(RunStatus),
    "started_at": optional_time,
    "finished_at": optional_time,
    "account": optional_text,
    "exit_code": st.none() | st.integers(-9, 255),
    "reason": optional_text,
    "result": optional_text,
    "session_id": optional_text,
    "excerpt": optional_text,
    "log_path": optional_text,
    "attempts": st.integers(0, 5),
    "notes": st.lists(st.text(max_size=3), max_size=3).map(tuple),
}


@given(st.fixed_dictionaries({}, optional=CHANGES))
def test_a_change_is_the_record_evolve_would_make(changes: dict[str, Any]) -> None:
    changed = _changed(BASE, **changes)
    assert changed == attrs.evolve(BASE, **changes)
    # A copy: the original is untouched, whatever changed.
    assert BASE.status is RunStatus.QUEUED
    assert BASE.notes == ("first",)
    assert type(changed) is RunRecord


def test_a_misspelt_field_is_refused_not_added() -> None:
    with pytest.raises(AttributeError):
        _changed(BASE, stauts=RunStatus.RUNNING)


@pytest.mark.parametrize("name", ["status", "not_a_field"])
def test_a_record_refuses_every_assignment(name: str) -> None:
    # Not slotted (building one is cheaper), so nothing but attrs' frozen
    # __setattr__ keeps an attribute from being changed or added.
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(BASE, name, RunStatus.RUNNING)
    assert BASE.status is RunStatus.QUEUED
    assert not hasattr(BASE, "not_a_field")
