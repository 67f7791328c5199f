"""The live dashboard the supervisor serves at ``/`` beside its API (docs/dashboard.md)."""
