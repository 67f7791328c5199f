"""A submitted run's text fields are checked as UTF-8 text, whatever shortcut the check takes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.intake import MAX_PROMPT_BYTES, InvalidRequest, parse_submit

# Every code point, lone surrogates and NUL included, ASCII often. (st.text
# leaves surrogates out whatever the alphabet: joined by hand.)
any_text = st.lists(
    st.characters() | st.characters(categories=["Cs"]) | st.sampled_from("\0 ")
).map("".join) | st.text(st.characters(max_codepoint=127))


def is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@given(any_text)
def test_a_prompt_is_refused_exactly_when_it_is_not_storable_text(prompt: str) -> None:
    body = {"provider": "demo", "prompt": prompt}
    if not is_text(prompt):
        expected = "prompt: must be valid Unicode text"
    elif "\0" in prompt:
        expected = "prompt: must not contain a NUL character"
    elif not prompt.strip():
        expected = "prompt: required and must not be empty"
    else:
        new, _ = parse_submit(body, {"demo"})
        assert new.prompt == prompt
        return
    with pytest.raises(InvalidRequest) as caught:
        parse_submit(body, {"demo"})
    assert (caught.value.status, caught.value.message) == (422, expected)


def test_the_prompt_limit_counts_bytes_not_characters() -> None:
    within = "é" * (MAX_PROMPT_BYTES // 2)
    assert parse_submit({"provider": "demo", "prompt": within}, {"demo"})[0].prompt == within
    with pytest.raises(InvalidRequest, match=f"at most {MAX_PROMPT_BYTES} bytes"):
        parse_submit({"provider": "demo", "prompt": within + "é"}, {"demo"})


@given(st.sampled_from([{}, {"k": None}, {"k": [1, {"x": "é"}]}]))
def test_metadata_is_kept_as_given_empty_or_not(metadata: dict[str, object]) -> None:
    new, _ = parse_submit({"provider": "demo", "prompt": "x", "metadata": metadata}, {"demo"})
    assert new.metadata == metadata


def test_unknown_fields_are_named_first_in_order() -> None:
    with pytest.raises(InvalidRequest, match=r"^extra: unknown field; expected one of id,"):
        parse_submit({"provider": "demo", "prompt": "x", "zz": 1, "extra": 2}, {"demo"})
