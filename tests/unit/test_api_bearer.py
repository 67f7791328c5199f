"""The bearer token is read from an Authorization header as RFC 7235 writes it."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from herdsman.runtime.api.app import bearer_token

tokens = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=60)
any_case = st.lists(st.booleans(), min_size=6, max_size=6).map(
    lambda upper: "".join(c.upper() if u else c for c, u in zip("bearer", upper, strict=True))
)


@given(any_case, st.integers(1, 4), tokens)
def test_the_scheme_in_any_case_and_any_spaces_give_the_token(
    scheme: str, spaces: int, token: str
) -> None:
    assert bearer_token(f"{scheme}{' ' * spaces}{token}") == token.encode()


@given(st.text(max_size=20), tokens)
def test_another_scheme_gives_nothing(scheme: str, token: str) -> None:
    assume(scheme.partition(" ")[0].lower() != "bearer")
    assert bearer_token(f"{scheme} {token}") == b""


def test_no_header_or_no_space_gives_nothing() -> None:
    assert bearer_token("") == b""
    assert bearer_token("Bearer") == b""
    assert bearer_token("Bearertoken") == b""
