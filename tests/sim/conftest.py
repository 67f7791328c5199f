"""Fixtures of the simulator tests (they live in sim_fixtures; see why there)."""

from sim_fixtures import _restore_herdsman_log_level, quiet_herdsman, thresholds

__all__ = ["_restore_herdsman_log_level", "quiet_herdsman", "thresholds"]
