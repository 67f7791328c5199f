"""Fixtures of the dashboard's tests (helpers live in dashboard_support)."""

from dashboard_support import served

__all__ = ["served"]
