"""Spawning through the C library's ``posix_spawn``: one blocking call, one GIL hand-off.

``subprocess.Popen`` (CPython 3.11 to 3.13, our arguments: a ``cwd``, a new
session, ``close_fds``) already forks with ``vfork``, but around it makes
five system calls that release the GIL (the error pipe, the fork-exec, two
closes, and a read that waits for the child's ``exec``). The spawn runs in a
worker thread while the event loop holds the GIL most of the time, so each
of those that blocks, the fork-exec and often the read, costs the thread a
wait for the GIL, up to the 5 ms switch interval. ``posix_spawn`` (glibc)
also forks with ``CLONE_VFORK``, reports a failed ``exec`` through memory
shared with the child instead of a pipe, and is one call: the thread gives
the GIL up once. ``os.posix_spawn`` has no ``cwd`` and cannot close the
descriptors a child inherits, so this calls glibc through ``ctypes``, with
``posix_spawn_file_actions_addchdir_np`` (glibc 2.29) and
``posix_spawn_file_actions_addclosefrom_np`` (glibc 2.34).

The child gets what ``Popen(argv, stdin=, stdout=, stderr=, env=, cwd=,
start_new_session=True)`` gives it: the three descriptors as 0, 1 and 2,
every other descriptor closed, the working directory, the environment
exactly, a new session (``POSIX_SPAWN_SETSID``), the same signals at
their default action (:func:`_default_signals`), the calling thread's
signal mask, and ``argv[0]``
looked up on the ``PATH`` of ``env``, trying the candidates in the same
order. Nothing else differs: whatever this path does not handle, it leaves
to ``Popen``; see :func:`spawn_child`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

# From glibc's <spawn.h>; Python exposes none of the attribute flags.
_POSIX_SPAWN_SETSIGDEF: Final = 0x04
_POSIX_SPAWN_SETSID: Final = 0x80
# glibc's posix_spawn_file_actions_t is 80 bytes and posix_spawnattr_t 336
# on x86-64 (and smaller elsewhere); a buffer of this size holds either.
_STRUCT_BYTES: Final = 1024
_SIGSET_BYTES: Final = 128  # sigset_t: 1,024 bits

_Arguments = ctypes.Array[ctypes.c_char_p]


class _Libc:
    """The C library's spawn functions, and the one attribute set every spawn uses."""

    def __init__(self) -> None:
        # posix_spawn blocks until the child has exec'd: through CDLL, which
        # gives up the GIL for the call. The rest return at once: through
        # PyDLL, which keeps it (each hand-off can cost a wait to get it back).
        blocking, quick = ctypes.CDLL(None), ctypes.PyDLL(None)
        self.spawn = blocking.posix_spawn
        self.actions_init = quick.posix_spawn_file_actions_init
        self.actions_destroy = quick.posix_spawn_file_actions_destroy
        self.add_dup2 = quick.posix_spawn_file_actions_adddup2
        self.add_chdir = quick.posix_spawn_file_actions_addchdir_np
        self.add_closefrom = quick.posix_spawn_file_actions_addclosefrom_np
        # Read-only once made, so every thread's spawns share it.
        self.attributes = ctypes.create_string_buffer(_STRUCT_BYTES)
        _check(quick.posix_spawnattr_init(self.attributes))
        _check(quick.posix_spawnattr_setsigdefault(self.attributes, _default_signals()))
        _check(
            quick.posix_spawnattr_setflags(
                self.attributes, ctypes.c_short(_POSIX_SPAWN_SETSIGDEF | _POSIX_SPAWN_SETSID)
            )
        )


def _default_signals() -> ctypes.Array[ctypes.c_ulong]:
    """The signals the child gets at their default action: a ``sigset_t``.

    ``SIGPIPE`` and ``SIGXFSZ``, which Python ignores and ``Popen`` restores.
    And glibc's own signals (32 up to ``SIGRTMIN``: thread cancellation,
    set*id): its ``posix_spawn`` leaves them *ignored* in the child unless
    listed here, and an ignored signal stays ignored across ``exec``; in
    ``Popen``'s child they end at their default, as everywhere else. glibc's
    ``sigaddset`` refuses them, so the bits are set directly, laid out as
    glibc lays them out: bit ``(n - 1) % W`` of word ``(n - 1) // W``, for
    words of W bits.
    """
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    words = (ctypes.c_ulong * (_SIGSET_BYTES * 8 // bits))()
    for number in (signal.SIGPIPE, signal.SIGXFSZ, *range(32, signal.SIGRTMIN)):
        words[(number - 1) // bits] |= 1 << ((number - 1) % bits)
    return words


def _check(status: int) -> None:
    if status != 0:
        raise OSError(status, os.strerror(status))


def _load() -> _Libc | None:
    """The C library's functions, or None where there are not all of them (not glibc >= 2.34)."""
    if sys.platform != "linux":
        return None
    try:
        return _Libc()
    except (AttributeError, OSError):
        return None


_LIBC: Final = _load()
# access() checks the real ids, exec the effective ones: they must agree for
# _candidates to leave out only what exec would refuse.
_SAME_IDS: Final = os.getuid() == os.geteuid() and os.getgid() == os.getegid()


def available() -> bool:
    """Whether spawns here go through ``posix_spawn`` (else all through ``Popen``)."""
    return _LIBC is not None


def _encoded(value: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> bytes | None:
    """``value`` as the C library takes it, or None if it holds a NUL (Popen's error to raise)."""
    encoded = os.fsencode(value)
    return None if b"\0" in encoded else encoded


def _environment(env: Mapping[str, str]) -> list[bytes] | None:
    """``NAME=value`` lines, or None for a name with ``=`` or a NUL anywhere (Popen raises)."""
    lines = []
    for name, value in env.items():
        key = os.fsencode(name)
        line = key + b"=" + os.fsencode(value)
        if b"=" in key or b"\0" in line:
            return None
        lines.append(line)
    return lines


def _candidates(program: bytes, env: Mapping[str, str]) -> list[bytes]:
    """The paths ``Popen`` would try to exec ``program`` at, in its order, less hopeless ones.

    ``Popen``'s child tries one ``execve`` after another in one process; a
    failed ``posix_spawn`` costs a whole child. So an absolute path that
    ``access`` says cannot be executed, which ``execve`` would refuse too
    (with the real and effective ids equal: see :func:`try_spawn`), is left
    out. A relative one is tried as it is: it is resolved in the child's
    working directory, not ours.
    """
    if os.path.dirname(program):
        return [program]
    found = []
    for folder in os.get_exec_path(env):
        path = os.path.join(os.fsencode(folder), program)
        if not os.path.isabs(path) or os.access(path, os.X_OK):
            found.append(path)
    return found


def try_spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | None,
    *,
    stdin: int,
    stdout: int,
    stderr: int,
) -> int | None:
    """Spawn ``argv`` as ``Popen`` would with these arguments (module docstring); its pid.

    None where this path would not be exactly ``Popen``'s or did not
    succeed: no glibc with the functions it needs, a descriptor below 3 (a
    supervisor started with 0, 1 or 2 closed), a NUL or an ``=`` where
    ``Popen`` raises, or a spawn that failed (no such program, a missing
    working directory, no memory), or a process whose real and effective
    ids differ. The caller then spawns with ``Popen``,
    which spawns the child or raises its own error, with its own message
    (which of the program and the directory was missing, say): a failure
    costs a second attempt, a success nothing.
    """
    libc = _LIBC
    if libc is None or not _SAME_IDS or min(stdin, stdout, stderr) < 3:
        return None
    arguments = [_encoded(argument) for argument in argv]
    lines = _environment(env)
    folder = None if cwd is None else _encoded(cwd)
    if lines is None or None in arguments or (cwd is not None and folder is None):
        return None
    sys.audit("subprocess.Popen", argv[0], list(argv), cwd, env)
    c_argv: _Arguments = (ctypes.c_char_p * (len(arguments) + 1))(*arguments)
    c_env: _Arguments = (ctypes.c_char_p * (len(lines) + 1))(*lines)
    actions = ctypes.create_string_buffer(_STRUCT_BYTES)
    pid = ctypes.c_int()
    _check(libc.actions_init(actions))
    try:
        for source, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            _check(libc.add_dup2(actions, source, target))
        if folder is not None:
            _check(libc.add_chdir(actions, folder))
        _check(libc.add_closefrom(actions, 3))
        for path in _candidates(arguments[0], env):  # type: ignore[arg-type]  # no None left
            # As Popen's child does: the first path that execs is the one;
            # should none, Popen is the one to say why.
            if libc.spawn(ctypes.byref(pid), path, actions, libc.attributes, c_argv, c_env) == 0:
                return pid.value
        return None
    finally:
        libc.actions_destroy(actions)
