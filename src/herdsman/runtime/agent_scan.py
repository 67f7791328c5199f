"""Finding agents' processes in ``/proc``, with the standard library only.

Every agent herdsman spawns inherits ``HERDSMAN_RUN_ID`` and
``HERDSMAN_STATE_DIR``, and so do the processes it starts: the environment
a process was started with survives pid reuse and tells apart supervisors
on other state directories. Used at a restart (orphans.py, orphan_watch.py)
and by a fleet member's fence keeper (fence_keeper.py), which must start
fast and so imports nothing heavy. Also which members of process groups
still run (runner/group.py, fence_keeper.py), and whether a fence keeper
is stopped (fence.py).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from pathlib import Path

__all__ = ["agents_under", "is_stopped", "running_in", "running_members"]

_RUN_ID = b"HERDSMAN_RUN_ID="


def agents_under(state_dir: Path | str) -> dict[str, set[int]]:
    """Process groups of every process started for a run under ``state_dir``, by run id.

    Reads ``/proc/<pid>/environ``; where there is no ``/proc`` (not Linux)
    nothing is found. Processes of other users cannot be read and are skipped.
    """
    marker = f"HERDSMAN_STATE_DIR={state_dir}".encode()
    found: dict[str, set[int]] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if marker not in environ:
                continue
            entry = next((e for e in environ if e.startswith(_RUN_ID)), None)
            if entry is not None:
                run_id = entry[len(_RUN_ID) :].decode("utf-8", "replace")
                found.setdefault(run_id, set()).add(os.getpgid(pid))
        except (OSError, ProcessLookupError):  # gone meanwhile, or not ours to read
            continue
    return found


def _state_and_group(pid: int | str) -> tuple[bytes, int] | None:
    """The state letter and the process group of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    # Fields after the parenthesised command name: state, ppid, pgrp, ...
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 3:
        return None
    return fields[0], int(fields[2])


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, or a tracer holds it): it runs no code until continued.

    False for a process that runs, sleeps, has gone, or where there is no ``/proc``.
    """
    found = _state_and_group(pid)
    return found is not None and found[0] in (b"T", b"t")


def running_in(groups: Collection[int]) -> Iterator[int]:
    """The pids of the members of ``groups`` still running (zombies don't count), as found.

    Raises OSError when /proc cannot be read.
    """
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _state_and_group(entry)
            if found is not None and found[1] in groups and found[0] not in (b"Z", b"X"):
                yield int(entry)


def running_members(pgid: int) -> Iterator[int]:
    """The pids of group ``pgid``'s members still running (zombies don't count), as found.

    Raises OSError when /proc cannot be read.
    """
    return running_in((pgid,))
