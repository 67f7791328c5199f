"""The deterministic simulator: replay traces through the real supervisor (docs/simulator.md)."""
