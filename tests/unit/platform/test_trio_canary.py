"""Canary: the trio internals herdsman's determinism work relies on are still there.

trio is pinned to one minor version (pyproject.toml) because the simulator
reaches into its scheduler (FINDINGS.md: the module-level ``_r`` random
generator and the ``_ALLOW_DETERMINISTIC_SCHEDULING`` flag). When an upgrade
moves them, this fails first, with the reason, instead of the simulator
silently losing its reproducibility.
"""

from __future__ import annotations

import random
from importlib.metadata import version

import trio
import trio._core._run as trio_run
from trio.testing import MockClock


def test_trio_is_the_pinned_minor_version() -> None:
    assert version("trio").startswith("0.35."), (
        "trio was upgraded: re-check the internals below and FINDINGS.md, then move the pin"
    )


def test_the_scheduler_randomness_hooks_exist() -> None:
    assert isinstance(trio_run._r, random.Random)
    assert isinstance(trio_run._ALLOW_DETERMINISTIC_SCHEDULING, bool)


def test_mock_clock_autojump_runs_virtual_time() -> None:
    clock = MockClock(autojump_threshold=0)

    async def sleeper() -> float:
        await trio.sleep(3600)
        return trio.current_time()

    assert trio.run(sleeper, clock=clock) == 3600.0
