"""Fixtures of the configuration tests (they live in config_fixtures; see why there)."""

from config_fixtures import config_path, errors, load

__all__ = ["config_path", "errors", "load"]
