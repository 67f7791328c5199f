"""Which adapter and which renderer go with a protocol, and which protocol a line is."""

from __future__ import annotations

import time
from collections.abc import Callable

from herdsman.runtime.runner.protocols import claude, codex
from herdsman.runtime.runner.protocols.base import ProtocolAdapter, StreamRenderer, json_object
from herdsman.runtime.runner.protocols.plain import PlainAdapter


def make_adapter(
    protocol: str,
    *,
    usage_limit_pattern: str | None = None,
    now: Callable[[], float] = time.time,
) -> ProtocolAdapter:
    """The adapter for ``protocol`` (``plain``, ``claude`` or ``codex``).

    ``now`` (unix seconds) dates relative reset times such as "try again in 2
    hours"; tests pass a fixed one.
    """
    if protocol == "plain":
        return PlainAdapter(usage_limit_pattern)
    if protocol == "claude":
        return claude.ClaudeAdapter(now=now)
    if protocol == "codex":
        return codex.CodexAdapter(now=now)
    raise ValueError(f"unknown protocol {protocol!r}; expected plain, claude or codex")


def make_renderer(protocol: str) -> StreamRenderer:
    """The renderer for ``protocol``: its stream as text for ``herdsman logs``."""
    if protocol == "claude":
        return claude.ClaudeRenderer()
    if protocol == "codex":
        return codex.CodexRenderer()
    if protocol == "plain":
        return StreamRenderer()
    raise ValueError(f"unknown protocol {protocol!r}; expected plain, claude or codex")


def detect_protocol(line: str | bytes) -> str | None:
    """The protocol whose event ``line`` is, or None for a line that is no event.

    A log does not say which provider wrote it, and the provider's protocol
    may have changed since; its lines do: each agent CLI's events have
    ``type`` values of their own.
    """
    event = json_object(line)
    if event is None:
        return None
    kind = event.get("type")
    if kind in claude.EVENT_TYPES:
        return "claude"
    if kind in codex.EVENT_TYPES:
        return "codex"
    return None
