"""Fixtures of the runner's integration tests."""

from __future__ import annotations

import pytest

from herdsman.runtime.runner import spawn as spawn_module


@pytest.fixture(params=["pidfd", "waitid"])
def exit_watch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of seeing a child's exit: a pidfd (Linux), and waitid where there is none."""
    if request.param == "waitid":
        monkeypatch.setattr(spawn_module, "_pidfd", lambda pid: None)
    param: str = request.param
    return param
