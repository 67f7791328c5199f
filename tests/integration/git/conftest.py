"""Fixtures of the git tests (they live in git_support; see why there)."""

from git_support import world

__all__ = ["world"]
