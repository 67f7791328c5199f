"""The cattrs converter that turns checked data into the model, and the model into JSON."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import cattrs

from herdsman.config.durations import format_duration
from herdsman.config.model import Config

__all__ = ["converter", "structure_config", "unstructure_config"]

converter = cattrs.Converter()
# Validation already produced these types; structuring must not re-interpret them.
converter.register_structure_hook(Path, lambda value, _: value)
converter.register_structure_hook(timedelta, lambda value, _: value)
# A budget of 60 runs stays the whole number written; only dollars have cents.
converter.register_structure_hook(float, lambda value, _: value)
converter.register_unstructure_hook(Path, str)
converter.register_unstructure_hook(timedelta, format_duration)


def structure_config(data: dict[str, Any]) -> Config:
    """Build the model from data the validator has checked and normalised."""
    return converter.structure(data, Config)


def unstructure_config(config: Config) -> dict[str, Any]:
    """JSON-ready plain data: durations as duration strings, paths as strings."""
    data: dict[str, Any] = converter.unstructure(config)
    return data
