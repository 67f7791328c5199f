"""Synthetic traces for the simulator's tests: seeded, small, and busy on purpose."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from herdsman.config import load_config_text
from herdsman.config.report import config_as_json

T = TypeVar("T")


def within(seconds: float, work: Callable[[], T]) -> T:
    """``work()``'s result; a failure, not a hang, if it takes longer than ``seconds``.

    A simulator run given up on goes on in its thread, under pyfakefs's
    process-wide patch: give ``work`` a wall limit of its own below
    ``seconds`` by more than ``FREEZE_GRACE`` (the wait for a frozen run to
    park), so the simulator freezes it first and ends the patch itself.
    """
    out: list[T] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert out, f"no end within {seconds}s: it hangs"
    return out[0]


CONFIG = """\
[supervisor]
state_dir = "/sim/state"
max_concurrency = 4

[providers.claude]
exec = ["claude", "-p"]
concurrency = 3
resume_args = ["--resume", "{session}"]

[[providers.claude.accounts]]
name = "work"
concurrency = 2
window = "1h"
budget = 30

[[providers.claude.accounts]]
name = "spare"

[providers.codex]
exec = ["codex", "exec"]
concurrency = 2

[[repos]]
name = "app"
path = "/sim/repos/app"
"""


def config_json(text: str = CONFIG) -> dict[str, Any]:
    loaded = load_config_text(text, Path("/sim/supervisor.toml"), environ={})
    return config_as_json(loaded.config)


def busy_trace(path: Path, runs: int = 120, seed: int = 7) -> Path:
    """Submits with follow-ups, shared agents, folders, usage limits, cancels and a reload."""
    rng = random.Random(seed)
    header = {
        "herdsman_trace": 1,
        "started_at": "2026-11-29T12:00:00.000000Z",
        "config": config_json(),
    }
    lines = [header]
    t = 0.0
    for n in range(runs):
        t += round(rng.choice((0.0, 0.0, 0.5, 1.0, 2.5)), 3)  # ties on purpose
        run: dict[str, Any] = {
            "id": f"r{n:03d}",
            "provider": rng.choice(("claude", "claude", "codex")),
            "conversation": rng.choice((None, "c1", "c2", "c3", "c4", "c5")),
            "workspace": "default",
        }
        if rng.random() < 0.3:
            run["agent"] = rng.choice(("a1", "a2"))
        if rng.random() < 0.15:
            run["cwd"] = rng.choice(("/sim/repos/app", "/sim/repos/app/src"))
        if run["conversation"] is None:
            del run["conversation"]
        outcome = rng.choice(("succeeded",) * 8 + ("failed", "usage_limited"))
        event = {"t": t, "seq": 0, "event": "submit", "run": run}
        event["duration"] = round(rng.choice((1.0, 1.0, 3.0, 7.5)), 3)
        event["outcome"] = outcome
        lines.append(event)
        if n == runs // 2:
            changed = config_json(CONFIG.replace("concurrency = 3", "concurrency = 1"))
            lines.append({"t": t, "seq": 0, "event": "reload", "generation": 2, "config": changed})
        if n % 17 == 5:
            lines.append({"t": t, "seq": 0, "event": "cancel", "run_id": f"r{n - 1:03d}"})
    for seq, line in enumerate(lines[1:]):
        line["seq"] = seq
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def herdsman(*args: str, cwd: Path, hash_seed: str = "0") -> subprocess.CompletedProcess[str]:
    """``herdsman ARGS`` in a process of its own, with this ``PYTHONHASHSEED``."""
    return subprocess.run(
        [sys.executable, "-m", "herdsman", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
    )
