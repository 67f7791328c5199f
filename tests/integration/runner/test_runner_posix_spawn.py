"""Spawning through posix_spawn: the child gets exactly what Popen gives it.

Every test but the first runs a child both ways (the ``spawn_path``
fixture: posix_spawn, and Popen, its fallback) and checks what the child
saw, or the error, against the same expectation.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runner_helpers import PYTHON, make_spec, script

from herdsman.runtime.runner import execute, posix_spawn
from herdsman.runtime.runner.spec import Outcome

# What a child can tell about how it was started.
REPORT = """
import json, os, sys
fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
print(json.dumps({
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "env": {k: v for k, v in os.environ.items() if k not in ("PWD", "LC_CTYPE")},
    "fds": fds,
    "session_leader": os.getsid(0) == os.getpid(),
    "group_leader": os.getpgid(0) == os.getpid(),
    "stdin": sys.stdin.read(),
}))
"""


@pytest.fixture
def inheritable_fd() -> Iterator[int]:
    """A descriptor the supervisor leaves inheritable: no child may get it."""
    fd = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(fd, True)
    yield fd
    os.close(fd)


async def _report(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    spec = make_spec(tmp_path, argv=script(REPORT), **overrides)
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED, outcome
    report: dict[str, Any] = json.loads(spec.log_path.read_text())
    return report


async def test_spawns_here_go_through_posix_spawn_not_popen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This machine has what the fast path needs (Linux, glibc >= 2.34).
    assert posix_spawn.available()

    def no_popen(*args: object, **kwargs: object) -> None:
        raise AssertionError("spawned through subprocess.Popen")

    monkeypatch.setattr(subprocess, "Popen", no_popen)
    outcome = await execute(make_spec(tmp_path, argv=script("print('hi')")))
    assert outcome.status is Outcome.SUCCEEDED
    assert (tmp_path / "logs" / "run.log").read_text() == "hi\n"


async def test_the_child_gets_its_cwd_env_session_stdin_and_nothing_else(
    tmp_path: Path, spawn_path: str, inheritable_fd: int
) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = {"PATH": os.defpath, "LANG": "C.UTF-8", "ONLY": "this", "EMPTY": ""}
    report = await _report(tmp_path, cwd=cwd, env=env, prompt="the prompt\n")
    assert report == {
        "argv": [],
        "cwd": str(cwd),
        "env": env,  # exactly: nothing of the supervisor's own leaks in
        "fds": [0, 1, 2, 3],  # 3: the listing's own; not inheritable_fd, nor any pipe
        "session_leader": True,
        "group_leader": True,
        "stdin": "the prompt\n",
    }


async def test_the_child_starts_with_no_signal_ignored_or_blocked(
    tmp_path: Path, spawn_path: str
) -> None:
    # SIGPIPE and SIGXFSZ, which Python ignores, are back at their default
    # action, and so are glibc's own signals (32 and 33), which posix_spawn
    # would leave ignored: an ignored signal stays ignored across exec. (Not
    # a Python child: Python ignores SIGPIPE and SIGXFSZ itself.)
    argv = ("/bin/sh", "-c", "exec grep -E '^Sig(Ign|Blk)' /proc/self/status")
    spec = make_spec(tmp_path, argv=argv)
    assert (await execute(spec)).status is Outcome.SUCCEEDED
    assert spec.log_path.read_text() == "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"


async def test_a_bare_name_is_looked_up_on_the_path_of_the_env_in_order(
    tmp_path: Path, spawn_path: str
) -> None:
    not_executable, first, second = (tmp_path / name for name in ("plain", "first", "second"))
    relative = tmp_path / "work" / "bin"
    for folder in (not_executable, first, second, relative):
        folder.mkdir(parents=True)
    (not_executable / "agent").write_text("#!/bin/sh\necho plain\n")  # no x bit: skipped
    for folder in (first, second, relative):
        program = folder / "agent"
        program.write_text(f'#!/bin/sh\necho {folder.name} "$@"\n')
        program.chmod(program.stat().st_mode | stat.S_IXUSR)
    spec_env = {"PATH": f"{not_executable}:bin:{first}:{second}"}
    # "bin" is relative: it is the child's working directory it is found in.
    spec = make_spec(tmp_path, argv=("agent", "x"), env=spec_env, cwd=tmp_path / "work")
    assert (await execute(spec)).status is Outcome.SUCCEEDED
    assert spec.log_path.read_text() == "bin x\n"
    (relative / "agent").unlink()
    assert (await execute(spec)).status is Outcome.SUCCEEDED
    assert spec.log_path.read_text() == "first x\n"


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("program", "[Errno 2] No such file or directory: 'no-such-agent'"),
        ("cwd", "[Errno 2] No such file or directory: "),
        ("nul", "embedded null byte"),
        ("equals", "illegal environment variable name"),
    ],
)
async def test_a_spawn_that_fails_raises_what_popen_raises(
    tmp_path: Path, spawn_path: str, what: str, message: str
) -> None:
    cases: dict[str, dict[str, Any]] = {
        "program": {"argv": ("no-such-agent",)},
        "cwd": {"cwd": tmp_path / "gone"},
        "nul": {"env": {"PATH": os.defpath, "X": "a\0b"}},
        "equals": {"env": {"PATH": os.defpath, "A=B": "c"}, "argv": (PYTHON, "-c", "")},
    }
    overrides = cases[what]
    with pytest.raises((OSError, ValueError)) as raised:
        await execute(make_spec(tmp_path, **overrides))
    assert message in str(raised.value)
    if what == "cwd":  # the directory is named, not the program
        assert str(tmp_path / "gone") in str(raised.value)


def test_without_the_c_librarys_functions_every_spawn_goes_through_popen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(posix_spawn, "_LIBC", None)
    assert not posix_spawn.available()
    read, write = os.pipe()
    try:
        spawned = posix_spawn.try_spawn(
            ["/bin/true"], {}, None, stdin=read, stdout=write, stderr=write
        )
        assert spawned is None
    finally:
        os.close(read)
        os.close(write)
