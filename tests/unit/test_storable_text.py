"""What the supervisor stores of an agent's output: valid text, no NUL, nothing else changed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.supervisor import as_text

# Lone surrogates (Cs) are what a decoder with surrogateescape leaves in text.
any_text = st.text(st.characters(codec=None, categories=None)) | st.text(
    st.sampled_from("ab\0\ud800\udfff\u00e9\U0001f600 \n")
)


@given(any_text)
def test_storable_text_is_the_text_with_only_surrogates_and_nul_replaced(value: str) -> None:
    stored = as_text(value)
    assert stored is not None
    stored.encode("utf-8")  # storable: no lone surrogate is left
    assert "\0" not in stored
    assert stored == value.encode("utf-8", "replace").decode("utf-8").replace("\0", "\ufffd")
    if value.isascii() and "\0" not in value:
        assert stored is value  # the usual case is not copied


def test_no_text_stays_none() -> None:
    assert as_text(None) is None
