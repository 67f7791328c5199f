"""herdsman: a supervisor for coding-agent runs."""

__version__ = "0.1.0"
