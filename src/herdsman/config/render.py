"""Write one value as TOML on a single line, the way a user would type it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tomlkit

__all__ = ["inline_toml"]


def inline_toml(value: Any) -> str:
    """``4``, ``"15m"``, ``["claude", "-p"]``, ``{NAME = "value"}``."""
    if isinstance(value, Mapping):
        table = tomlkit.inline_table()
        table.update(value)
        return str(table.as_string())
    return str(tomlkit.item(value).as_string())
