"""A run's log for the dashboard: read in pieces, rendered as ``herdsman logs`` renders it."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from herdsman.runtime.runner.protocols import LogText
from herdsman.runtime.state_paths import LinkRefused, open_below

#: The most of a log one request reads; the page asks again for the rest.
CHUNK = 256 * 1024


def log_file(state_dir: Path, run_id: str) -> Path:
    """Where the run's log is (``run_id`` already checked to be a run id)."""
    return state_dir / "logs" / f"{run_id}.log"


def last_output(state_dir: Path, run_id: str) -> float | None:
    """When the run's log last grew (unix seconds), or ``None`` without a log yet."""
    try:
        return os.stat(log_file(state_dir, run_id), follow_symlinks=False).st_mtime
    except OSError:
        return None


def read_piece(state_dir: Path, run_id: str, offset: int, *, ended: bool) -> dict[str, Any]:
    """The log from ``offset``: whole lines rendered, and the offset to ask from next.

    While the run goes on, a partial last line is left for the next piece;
    once it has ``ended``, the rest is rendered whatever it is. ``missing``
    says there is no log (yet, or on this machine); ``error``, why a log
    that is there cannot be read.
    """
    path = log_file(state_dir, run_id)
    nothing: dict[str, Any] = {"text": "", "offset": offset, "missing": True, "more": False}
    try:
        # Never through a link: a log is a regular file in <state_dir>/logs.
        with os.fdopen(open_below(state_dir, path, os.O_RDONLY), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return {**nothing, "error": f"{path} is not a regular file"}
            size = os.fstat(handle.fileno()).st_size
            handle.seek(offset)
            data = handle.read(CHUNK)
    except FileNotFoundError:
        return nothing
    except LinkRefused as exc:
        return {**nothing, "error": str(exc)}
    except OSError as exc:
        return {**nothing, "error": f"cannot read the log {path}: {exc.strerror}"}
    more = offset + len(data) < size
    text = LogText()
    rendered = text.feed(data)
    cut = data.rfind(b"\n") + 1
    if (ended and not more) or (cut == 0 and len(data) == CHUNK):
        # The end of an ended run's log, or a line longer than a piece
        # (shown as it comes): nothing is left for the next piece.
        rendered += text.finish()
        cut = len(data)
    return {"text": rendered, "offset": offset + cut, "missing": False, "more": more}
