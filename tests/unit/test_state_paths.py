"""``state_paths`` never reaches outside the state directory, whatever links are planted."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.state_paths import (
    LinkRefused,
    make_private_dirs,
    open_below,
    read_below,
    refuse_links,
    replace_below,
)

#: What each component of a path below the anchor is before the call.
KINDS = st.sampled_from(["missing", "folder", "link to outside", "link inside", "file"])


def _plant(anchor: Path, outside: Path, parts: list[str], kinds: list[str]) -> Path:
    """Lay out ``anchor/parts...`` as ``kinds`` says, up to the first missing one, file
    or link."""
    current = anchor
    for part, kind in zip(parts, kinds, strict=True):
        current = current / part
        if kind == "missing":
            break
        if kind == "folder":
            current.mkdir()
        elif kind == "file":
            current.write_text("x")
            break
        else:  # nothing below it can be laid out without going through it
            target = outside if kind == "link to outside" else anchor
            current.symlink_to(target, target_is_directory=True)
            break
    return anchor.joinpath(*parts)


@given(st.lists(KINDS, min_size=1, max_size=4), st.sampled_from(["dirs", "open", "replace"]))
def test_nothing_is_ever_made_outside(kinds: list[str], how: str) -> None:
    with tempfile.TemporaryDirectory() as top:
        anchor, outside = Path(top) / "state", Path(top) / "outside"
        anchor.mkdir()
        outside.mkdir()
        parts = [f"p{n}" for n in range(len(kinds))]
        path = _plant(anchor, outside, parts, kinds)
        try:
            if how == "dirs":
                make_private_dirs(anchor, path)
            elif how == "open":
                os.close(open_below(anchor, path, os.O_WRONLY | os.O_CREAT, make_dirs=True))
            else:
                make_private_dirs(anchor, path.parent)
                replace_below(anchor, path, b"data")
        except OSError:
            pass
        else:
            # It worked: then no link is left on the way (one at a replaced
            # file is replaced), and what was made is there.
            refuse_links(anchor, path)
            assert path.exists()
        assert list(outside.iterdir()) == []


def test_a_link_anywhere_on_the_way_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").symlink_to(tmp_path)
    with pytest.raises(LinkRefused) as refused:
        read_below(tmp_path, tmp_path / "a" / "b" / "c", limit=10)
    assert refused.value.path == tmp_path / "a" / "b"
    assert str(refused.value).startswith(f"{tmp_path / 'a' / 'b'} is a symbolic link; ")
