"""Finding the programs providers name, the same way for `check` and for runs."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path


def scripts_dir() -> Path:
    """The folder herdsman's own console scripts were installed into."""
    return Path(sysconfig.get_path("scripts"))


def resolve_executable(name: str, path: str | None = None) -> str | None:
    """Find ``name`` on PATH, then beside herdsman's own scripts.

    The second place lets a config name ``herdsman-demo-agent`` (or any tool
    installed in herdsman's virtual environment) without the environment
    being activated. A name with a slash is taken as a path.
    """
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    search = path if path is not None else os.environ.get("PATH", os.defpath)
    return shutil.which(name, path=os.pathsep.join([search, str(scripts_dir())]))
