"""Why a run's process could not be spawned, in words for its reason (no Python reprs).

``Popen`` raises an ``OSError`` naming the file it failed on: the working
directory when the child could not enter it, the program when it could not
execute it; opening the log names the log. ``str()`` of such an error is
``[Errno 2] No such file or directory: PosixPath('/x')``, which a run's
reason must not show its user.
"""

from __future__ import annotations

import errno
import os

from herdsman.runtime.runner.spec import ProcessSpec

__all__ = ["why_not_spawned"]


def why_not_spawned(error: OSError, spec: ProcessSpec | None) -> str:
    """``error`` said plainly, naming the working directory, program or log it concerns.

    ``spec`` is None when the error came before there was one (preparing a
    checkout, say): the error's own words and file are said then.
    """
    what = error.strerror or str(error)
    name = None if error.filename is None else os.fsdecode(error.filename)
    if spec is not None and name == str(spec.cwd):
        return _working_directory(error.errno, name, what)
    if spec is not None and name == spec.argv[0]:
        return _program(error.errno, name, what)
    if spec is not None and name == spec.log_file:
        return f"its log {name} could not be opened: {what.lower()}"
    return what if name is None else f"{name}: {what.lower()}"


def _working_directory(code: int | None, cwd: str, what: str) -> str:
    if code == errno.ENOENT:
        return f"its working directory {cwd} does not exist"
    if code == errno.ENOTDIR:
        return f"its working directory {cwd} is not a directory"
    if code == errno.EACCES:
        return f"its working directory {cwd} may not be entered (permission denied)"
    return f"its working directory {cwd} could not be entered: {what.lower()}"


def _program(code: int | None, program: str, what: str) -> str:
    if code == errno.ENOENT:
        where = "" if "/" in program else " on its PATH"
        return f"its program {program} was not found{where}"
    if code == errno.EACCES:
        return f"its program {program} may not be run (permission denied)"
    return f"its program {program} could not be run: {what.lower()}"
