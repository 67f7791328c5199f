"""Request bodies decode as json.loads decodes them, NaN and Infinity refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.intake import InvalidRequest, load_json

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(values, st.sampled_from(["utf-8", "utf-16", "utf-16-le", "utf-32-be"]), st.booleans())
def test_a_body_decodes_as_json_loads_decodes_it(value: object, codec: str, ascii_: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_).encode(codec, "surrogatepass")
    assert load_json(raw) == json.loads(raw)


@pytest.mark.parametrize("raw", [b"NaN", b'{"a": Infinity}', b"[-Infinity]", b"{", b"\xff\xfe\x00"])
def test_what_json_does_not_allow_is_a_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as caught:
        load_json(raw)
    assert caught.value.status == 400
    assert "not valid JSON" in caught.value.message
