"""Fixtures of the supervisor integration tests (helpers live in supervisor_support)."""

from supervisor_support import start

__all__ = ["start"]
