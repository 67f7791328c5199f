"""Folder names for conversations: safe for any id, stable, and distinct.

A slug is a readable prefix of the conversation id (letters, digits, ``.``,
``_`` and ``-`` kept, runs of anything else folded to one ``-``, runs of dots
to one dot, at most 40 characters, never starting with ``.`` or ``-``)
followed by 32 hex digits of a SHA-256 of the workspace and the id. So:

- it is one path component: no ``/``, no ``..``, no control characters,
  never empty, at most 73 characters, whatever the id (even 10,000
  characters or a NUL);
- the same workspace and conversation always give the same slug — path
  stability matters because agent CLIs key resumable sessions by directory;
- it is also a valid git branch name component (``herdsman/<slug>``);
- different (workspace, conversation) pairs give different slugs unless
  SHA-256 collides in its first 128 bits, which is not a practical concern;
  the readable prefix alone is never trusted to tell two ids apart.
"""

from __future__ import annotations

import hashlib
import re

PREFIX_LENGTH = 40
DIGEST_HEX = 32
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_DOTS = re.compile(r"\.{2,}")  # ".." is not allowed in a git branch name


def conversation_slug(workspace: str, conversation: str) -> str:
    """The folder name of one conversation's worktrees."""
    readable = _DOTS.sub(".", _UNSAFE.sub("-", conversation))
    prefix = readable[:PREFIX_LENGTH].lstrip(".-") or "conversation"
    digest = hashlib.sha256(f"{workspace}\0{conversation}".encode("utf-8", "surrogatepass"))
    return f"{prefix}-{digest.hexdigest()[:DIGEST_HEX]}"
