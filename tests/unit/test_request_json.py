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


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (b'{"prompt": "a", "prompt": "b"}', "prompt"),
        (b'{"runs": [{"id": "x", "metadata": {"k": 1, "k": 1}}]}', "k"),
        (b'{"a": 1, "\\u0061": 2}', "a"),
    ],
)
def test_a_key_given_twice_in_one_object_is_a_400_naming_it(raw: bytes, key: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        load_json(raw)
    assert caught.value.status == 400
    assert caught.value.message == (
        f"the request body has the key {key!r} twice in one object; give it once"
    )


def test_the_same_key_in_different_objects_is_fine() -> None:
    assert load_json(b'{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}') == {
        "a": {"a": 1},
        "b": [{"a": 2}, {"a": 3}],
    }
