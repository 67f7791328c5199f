"""A record's text checks: plain text passes at once, anything else as ``check_texts`` says.

``new_record``, ``started`` and ``finished`` check the usual case (every text
ASCII without NUL) over the values alone, and only otherwise build the
mapping ``check_texts`` names the fields from. Either way the answer must be
``check_texts``'s over every field: the same error, or none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.store.records import (
    NewRun,
    RunEnd,
    RunStatus,
    check_texts,
    finished,
    new_record,
    started,
)

# Plain text, text that is valid but not ASCII, and what no ledger stores;
# and two values that are not text at all (a falsy one too).
texts: st.SearchStrategy[Any] = st.sampled_from(
    ["", "x", "a\0b", "\0", "é", "\U0001f600", "a\ud800", "\udfff"]
) | st.text(max_size=4)
maybe_texts = st.none() | texts
not_texts: st.SearchStrategy[Any] = st.sampled_from([0, b"", b"x", 7])


# The fields of a new record in the order they are checked (the first bad one is named).
ORDER = (
    "id",
    "provider",
    "prompt",
    "conversation",
    "agent",
    "workspace",
    "callback_url",
    "reason",
    "cwd",
)


def answer(call: Callable[[], object]) -> tuple[str, str] | None:
    """None if ``call`` passed, else its error's type and message."""
    try:
        call()
    except Exception as exc:
        return (type(exc).__name__, str(exc))
    return None


def checked(run_id: str, fields: Mapping[str, Any]) -> tuple[str, str] | None:
    return answer(lambda: check_texts(run_id, fields))


@given(
    st.fixed_dictionaries(
        {
            "id": texts,
            "provider": texts,
            "prompt": texts,
            "conversation": maybe_texts,
            "agent": maybe_texts,
            "workspace": texts,
            "callback_url": maybe_texts,
            "cwd": maybe_texts,
        }
    ),
    maybe_texts,
    st.sampled_from([RunStatus.QUEUED, RunStatus.SKIPPED]),
)
def test_a_new_record_is_refused_as_check_texts_refuses_its_fields(
    fields: dict[str, Any], reason: str | None, status: RunStatus
) -> None:
    new = NewRun(**fields)
    in_order = {name: {**fields, "reason": reason}[name] for name in ORDER}
    expected = checked(new.id, in_order)
    assert answer(lambda: new_record(new, 1, 1.0, status, reason)) == expected


def record() -> Any:
    return new_record(NewRun("r", "p", "x"), 1, 1.0, RunStatus.QUEUED)


@given(maybe_texts | not_texts)
def test_a_start_is_refused_as_check_texts_refuses_its_account(account: Any) -> None:
    expected = checked("r", {"account": account})
    assert answer(lambda: started(record(), 2.0, account)) == expected


@given(
    st.fixed_dictionaries(
        {
            "reason": maybe_texts | not_texts,
            "result": maybe_texts,
            "session_id": maybe_texts,
            "excerpt": maybe_texts | not_texts,
            "log_path": maybe_texts,
        }
    )
)
def test_a_finish_is_refused_as_check_texts_refuses_its_texts(fields: dict[str, Any]) -> None:
    running = started(record(), 2.0, None)
    names = ("reason", "result", "session_id", "excerpt", "log_path")
    expected = checked("r", {name: fields[name] for name in names})
    outcome = answer(
        lambda: finished(running, RunEnd(RunStatus.FAILED, exit_code=1, **fields), 3.0)
    )
    assert outcome == expected


@given(not_texts, st.sampled_from(["id", "prompt", "conversation", "cwd"]))
def test_a_value_that_is_not_text_fails_as_before(value: Any, name: str) -> None:
    fields: dict[str, Any] = {"id": "r", "provider": "p", "prompt": "x", name: value}
    new = NewRun(**fields)
    expected = checked("r", {name: {**fields, "reason": None}.get(name) for name in ORDER})
    assert expected is not None
    assert answer(lambda: new_record(new, 1, 1.0, RunStatus.QUEUED)) == expected
