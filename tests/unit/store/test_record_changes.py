"""The fast record copy every store's state changes use is ``attrs.evolve``, exactly."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.store.errors import StoreError
from herdsman.runtime.store.records import (
    _RECORD_FIELDS,
    NewRun,
    RunRecord,
    RunStatus,
    _changed,
    ended,
    new_record,
    noted,
    requeued,
    started,
)

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
    changed = _changed(BASE, changes)
    assert changed == attrs.evolve(BASE, **changes)
    # A copy: the original is untouched, whatever changed.
    assert BASE.status is RunStatus.QUEUED
    assert BASE.notes == ("first",)
    assert type(changed) is RunRecord


def test_a_misspelt_field_is_refused_not_added() -> None:
    with pytest.raises(AttributeError):
        _changed(BASE, {"stauts": RunStatus.RUNNING})


@pytest.mark.parametrize("name", ["status", "not_a_field"])
def test_a_record_refuses_every_assignment(name: str) -> None:
    # Not slotted (building one is cheaper), so nothing but attrs' frozen
    # __setattr__ keeps an attribute from being changed or added.
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(BASE, name, RunStatus.RUNNING)
    assert BASE.status is RunStatus.QUEUED
    assert not hasattr(BASE, "not_a_field")


def _every_way_to_make_a_record() -> list[RunRecord]:
    made = new_record(
        NewRun(id="r2", provider="p", prompt="x", metadata={"a": [1]}), 1, 1.0, RunStatus.QUEUED
    )
    running = started(made, 2.0, "acct")
    limited = ended(running, RunStatus.USAGE_LIMITED, 3.0, "limit")
    again = noted(requeued(limited), "note")
    return [
        made,
        running,
        limited,
        again,
        attrs.evolve(again, attempts=5, session_id="s", excerpt=""),
        copy.copy(again),
        copy.deepcopy(again),
        pickle.loads(pickle.dumps(again)),
    ]


@pytest.mark.parametrize("record", _every_way_to_make_a_record())
def test_a_record_holds_its_values_in_field_order_however_made(record: RunRecord) -> None:
    # _changed reads the values from __dict__ in this order.
    assert list(record.__dict__) == list(_RECORD_FIELDS)
    assert _changed(record, {}) == record
    assert _changed(record, {"reason": "r"}) == attrs.evolve(record, reason="r")


def test_a_record_is_built_by_storing_its_fields_and_nothing_else() -> None:
    # _changed copies a record's __dict__ instead of calling __init__: sound
    # only while __init__ has nothing else to do. A converter, validator or
    # hook added to RunRecord must make _changed call __init__ again.
    for field in attrs.fields(RunRecord):
        assert field.converter is None, field.name
        assert field.validator is None, field.name
        assert field.on_setattr is None, field.name
    for hook in ("__attrs_pre_init__", "__attrs_post_init__", "__attrs_init__"):
        assert not hasattr(RunRecord, hook), hook
    assert "__slots__" not in vars(RunRecord)


@given(
    st.builds(
        NewRun,
        id=st.text(max_size=3),
        provider=st.text(max_size=3),
        prompt=st.text(max_size=3),
        conversation=st.none() | st.text(max_size=3),
        agent=st.none() | st.text(max_size=3),
        workspace=st.text(max_size=3),
        callback_url=st.none() | st.text(max_size=3),
        metadata=st.dictionaries(st.text(max_size=2), st.integers() | st.none(), max_size=2),
        cwd=st.none() | st.text(max_size=3),
    ).filter(lambda new: all(v is None or "\0" not in v for v in vars(new).values())),
    st.sampled_from([RunStatus.QUEUED, RunStatus.SKIPPED]),
    st.none() | st.text(max_size=3),
)
def test_a_new_record_holds_each_value_in_its_own_field(
    new: NewRun, status: RunStatus, reason: str | None
) -> None:
    # Each of the submit's values lands in its own field, the rest at
    # their defaults, in the fields' order.
    try:
        record = new_record(new, 7, 2.0, status, reason)
    except StoreError:  # a lone surrogate: refused, as test_record_texts checks
        return
    assert record == RunRecord(
        id=new.id,
        provider=new.provider,
        prompt=new.prompt,
        conversation=new.conversation,
        agent=new.agent,
        workspace=new.workspace,
        callback_url=new.callback_url,
        metadata=dict(new.metadata),
        seq=7,
        status=status,
        submitted_at=2.0,
        finished_at=2.0 if status is RunStatus.SKIPPED else None,
        reason=reason,
        cwd=new.cwd,
    )
    assert list(record.__dict__) == list(_RECORD_FIELDS)
