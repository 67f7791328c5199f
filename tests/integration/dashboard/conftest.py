"""Fixtures of the dashboard's tests (helpers live in dashboard_support and browser_support)."""

from browser_support import browser
from dashboard_support import served, served_with_repo

__all__ = ["browser", "served", "served_with_repo"]
