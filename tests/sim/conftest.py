"""Fixtures of the simulator tests (helpers live in sim_workloads)."""
