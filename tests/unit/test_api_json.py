"""The API's JSON responses are byte for byte what Starlette's JSONResponse renders."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.responses import JSONResponse as StarletteJSONResponse

from herdsman.runtime.api.app import JSONResponse

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8")),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(values)
def test_a_body_renders_as_starlette_renders_it(value: object) -> None:
    assert JSONResponse(value).body == StarletteJSONResponse(value).body


@pytest.mark.parametrize("bad", [float("nan"), {"x": float("inf")}])
def test_what_json_cannot_hold_is_refused_as_by_starlette(bad: object) -> None:
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        StarletteJSONResponse(bad)
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        JSONResponse(bad)
