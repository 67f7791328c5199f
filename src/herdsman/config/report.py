"""``herdsman check`` output: an aligned listing for people, a stable JSON for tools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from herdsman.config.convert import unstructure_config
from herdsman.config.load import LoadedConfig
from herdsman.config.model import Config
from herdsman.config.problems import ConfigProblem
from herdsman.config.render import inline_toml

__all__ = ["JSON_FORMAT_VERSION", "check_json", "check_text", "config_as_json"]

JSON_FORMAT_VERSION = 1


def _display(value: Any) -> str:
    if value is None:
        return "(not set)"
    if isinstance(value, str):
        return value  # paths and durations read better unquoted here
    return inline_toml(value)


def config_as_json(config: Config) -> dict[str, object]:
    """The configuration as JSON-ready data (durations as strings, paths absolute).

    The same shape as ``config.values`` in ``check --json``.
    """
    return unstructure_config(config)


def check_text(loaded: LoadedConfig) -> str:
    """The effective configuration, one setting a line, grouped by table.

    Each line shows the key, the effective value and where it came from
    (``supervisor.toml:14``, ``default`` or ``--set``); warnings follow.
    """
    rows: list[tuple[str, str, str, str]] = []
    for key, value in loaded.toml_values.items():
        table, _, name = key.rpartition(".")
        rows.append((table, name, _display(value), str(loaded.origins[key])))
    name_width = max(len(row[1]) for row in rows)
    value_width = min(max(len(row[2]) for row in rows), 40)
    lines = [f"{loaded.path}: valid"]
    current: str | None = None
    for table, name, shown, origin in rows:
        if table != current:
            current = table
            lines.append(f"\n[{table}]")
        lines.append(f"  {name:<{name_width}}  {shown:<{value_width}}  {origin}".rstrip())
    if loaded.warnings:
        lines.append("\nwarnings:")
        lines.extend(f"  {warning}" for warning in loaded.warnings)
    return "\n".join(lines) + "\n"


def check_json(
    loaded: LoadedConfig | None, problems: Sequence[ConfigProblem] = ()
) -> dict[str, Any]:
    """The ``check --json`` document (see docs/configuration.md for its schema)."""
    return {
        "format": JSON_FORMAT_VERSION,
        "valid": loaded is not None and not problems,
        "path": None if loaded is None else str(loaded.path),
        "config": None
        if loaded is None
        else {
            "values": config_as_json(loaded.config),
            "origins": {key: str(origin) for key, origin in loaded.origins.items()},
        },
        "warnings": [] if loaded is None else list(loaded.warnings),
        "errors": [
            {
                "location": str(problem.location),
                "key": problem.key_path,
                "message": problem.message,
                "text": str(problem),
            }
            for problem in problems
        ],
    }
