"""Fixtures of the dashboard's tests (helpers live in dashboard_support)."""

from dashboard_support import served, served_with_repo

__all__ = ["served", "served_with_repo"]
