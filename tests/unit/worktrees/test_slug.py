"""Conversation slugs are single safe path components, stable and distinct."""

from __future__ import annotations

import subprocess
from pathlib import PurePosixPath

from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.worktrees.slug import conversation_slug

ids = st.text(min_size=1, max_size=300)


@given(workspace=st.text(max_size=50), conversation=ids)
def test_a_slug_is_one_safe_path_component(workspace: str, conversation: str) -> None:
    slug = conversation_slug(workspace, conversation)
    assert 0 < len(slug) <= 73
    assert slug not in (".", "..")
    assert not slug.startswith(".")
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in slug)
    root = PurePosixPath("/state/worktrees")
    assert (root / slug).parent == root


@given(workspace=st.text(max_size=50), conversation=ids)
def test_a_slug_is_stable(workspace: str, conversation: str) -> None:
    assert conversation_slug(workspace, conversation) == conversation_slug(workspace, conversation)


@given(a=st.tuples(st.text(max_size=20), ids), b=st.tuples(st.text(max_size=20), ids))
def test_different_conversations_get_different_slugs(
    a: tuple[str, str], b: tuple[str, str]
) -> None:
    if a != b:
        assert conversation_slug(*a) != conversation_slug(*b)


def test_examples() -> None:
    assert conversation_slug("default", "slack/C123/1700000000.1234").startswith(
        "slack-C123-1700000000.1234-"
    )
    hostile = conversation_slug("default", "../../etc/passwd")
    assert hostile.startswith("etc-passwd-")
    assert conversation_slug("default", "\x00").startswith("conversation-")
    assert len(conversation_slug("default", "x" * 10_000)) == 73
    # The workspace is part of the identity.
    assert conversation_slug("a", "c") != conversation_slug("b", "c")
    # Ids that fold to the same prefix still differ.
    assert conversation_slug("w", "a/b") != conversation_slug("w", "a:b")


def test_slugs_make_valid_git_branch_names() -> None:
    for conversation in ("a..b", "x.lock", "...", "-dash", "ünï/cødé", "a b\tc", "."):
        branch = f"refs/heads/herdsman/{conversation_slug('default', conversation)}"
        result = subprocess.run(
            ["git", "check-ref-format", branch], capture_output=True, check=False
        )
        assert result.returncode == 0, branch
