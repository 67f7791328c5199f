"""Where the supervisor running on a given config file listens, for the CLI.

The file itself may say otherwise for a while: an edit of ``api.listen``,
``api.token_file`` or ``state_dir`` waits for a restart, and an invalid edit
is not applied at all. So ``herdsman run`` leaves a small pointer — the URL,
the token file and its pid, keyed by the config file's real path — in a
private per-user folder, and the client commands look there first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

import attrs

from herdsman.runtime.state_paths import private_opener

__all__ = ["Pointer", "read_pointer", "remove_pointer", "write_pointer"]


@attrs.frozen
class Pointer:
    """A running supervisor's address and token file."""

    url: str
    token_file: Path
    pid: int


def _folder(environ: Mapping[str, str]) -> Path:
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "herdsman"
    return Path(tempfile.gettempdir()) / f"herdsman-{os.getuid()}"


def _path(config_file: Path, environ: Mapping[str, str]) -> Path:
    key = hashlib.sha256(str(config_file.resolve()).encode()).hexdigest()[:32]
    return _folder(environ) / f"{key}.json"


def _private(folder: Path) -> bool:
    # A shared temporary folder: only trust one that is ours and private.
    try:
        info = folder.stat()
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO)


def write_pointer(
    config_file: Path, url: str, token_file: Path, environ: Mapping[str, str] | None = None
) -> Path | None:
    """Record where this process serves ``config_file``; None if it cannot be written."""
    environ = os.environ if environ is None else environ
    path = _path(config_file, environ)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _private(path.parent):
            return None
        temp = path.with_suffix(f".{os.getpid()}.tmp")
        # Never written through a link planted at that (predictable) name.
        temp.unlink(missing_ok=True)
        fd = private_opener(str(temp), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(json.dumps({"url": url, "token_file": str(token_file), "pid": os.getpid()}))
        temp.replace(path)
    except OSError:
        return None  # the pointer is a convenience: without it the file's address is used
    return path


def read_pointer(config_file: Path, environ: Mapping[str, str] | None = None) -> Pointer | None:
    """The supervisor serving ``config_file``, if one left a pointer and still runs."""
    environ = os.environ if environ is None else environ
    path = _path(config_file, environ)
    if not _private(path.parent):
        return None
    try:
        with open(path, encoding="utf-8", opener=private_opener) as file:  # no link
            data = json.loads(file.read(64 << 10))
        pointer = Pointer(str(data["url"]), Path(data["token_file"]), int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        os.kill(pointer.pid, 0)
    except ProcessLookupError:
        return None  # left by a supervisor that is gone
    except PermissionError:
        pass
    return pointer


def remove_pointer(path: Path | None) -> None:
    """Remove a pointer this process wrote (stopping)."""
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()
