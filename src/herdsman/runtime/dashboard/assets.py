"""Where the dashboard's HTML, script and style sheet are (shipped in the package)."""

from __future__ import annotations

from importlib.resources import files

STATIC = files("herdsman.runtime.dashboard") / "static"
