"""Fixtures of the simulator tests, re-exported by conftest (helpers live in sim_workloads).

A module, not the conftest itself: every test folder's conftest has the one
module name ``conftest``, so a type checker can see only one of them; the
others only re-export.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restore_herdsman_log_level() -> Iterator[None]:
    # Tests and commands (sim fuzz) quieten the simulated supervisor's
    # logger; put it back after each test, for the tests that read it.
    logger = logging.getLogger("herdsman")
    level = logger.level
    yield
    logger.setLevel(level)


@pytest.fixture
def quiet_herdsman() -> None:
    """Silence the simulated supervisor: faults make it log warnings by the hundred."""
    logging.getLogger("herdsman").setLevel(logging.CRITICAL)


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    """The collector's thresholds, set to values of the test's own and put back after it."""
    before = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*before)
