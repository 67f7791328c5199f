"""A run's spec and its scheduler request stay values without slots.

Both are frozen attrs classes *without* slots (building one is cheaper):
nothing but attrs' frozen ``__setattr__`` keeps a field from being changed
or a new attribute from being added.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from herdsman.core import RunRequest
from herdsman.runtime.runner import ProcessSpec


def _spec() -> ProcessSpec:
    return ProcessSpec(
        ("agent",), {"HOME": "/home/a"}, Path("/work"), "hello", None, None, "/s/r.log", "plain"
    )


@pytest.mark.parametrize("name", ["prompt", "not_a_field"])
def test_a_spec_refuses_every_assignment(name: str) -> None:
    spec = _spec()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(spec, name, "changed")
    assert spec.prompt == "hello"
    assert not hasattr(spec, "not_a_field")


@pytest.mark.parametrize("name", ["provider", "not_a_field"])
def test_a_run_request_refuses_every_assignment(name: str) -> None:
    request = RunRequest("r1", "p", "c1")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(request, name, "changed")
    assert request.provider == "p"
    assert not hasattr(request, "not_a_field")


def test_equal_run_requests_hash_alike() -> None:
    # The scheduler may keep requests in sets and dict keys.
    assert hash(RunRequest("r1", "p", "c1")) == hash(RunRequest("r1", "p", "c1"))
    assert RunRequest("r1", "p", "c1") != RunRequest("r1", "p", "c2")


def test_a_spec_given_by_position_is_the_spec_given_by_name() -> None:
    by_name = ProcessSpec(
        argv=("agent",),
        env={"HOME": "/home/a"},
        cwd=Path("/work"),
        prompt="hello",
        timeout=None,
        idle_timeout=None,
        log_path="/s/r.log",
        protocol="plain",
    )
    assert _spec() == by_name
