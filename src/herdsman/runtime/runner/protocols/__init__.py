"""Protocol adapters: reading an agent CLI's output into a verdict, and into text.

Each adapter is fed stdout line by line (and stderr) while the process runs,
and gives a :class:`Verdict` once it exited. The exit code alone is not
trusted for the agent CLIs: Claude Code and Codex report success or failure
in their JSON streams, so ``claude`` and ``codex`` decide from the stream and
treat a stream without its final event as a failure, naming the agent's own
last error (or its last stderr line) as the cause. Lines that are not JSON
(banners, warnings) are ignored by the adapters; they still reach the log and
the excerpt.

Beside each adapter, in the module of its provider kind, is the renderer that
``herdsman logs`` uses to show the recorded stream as text (:class:`LogText`).
"""

from __future__ import annotations

from herdsman.runtime.runner.protocols.base import (
    ProtocolAdapter,
    StreamRenderer,
    Verdict,
    describe_exit,
)
from herdsman.runtime.runner.protocols.claude import ClaudeAdapter, ClaudeRenderer
from herdsman.runtime.runner.protocols.codex import CodexAdapter, CodexRenderer
from herdsman.runtime.runner.protocols.log_text import LogText
from herdsman.runtime.runner.protocols.plain import PLAIN_REPLY_LIMIT, PlainAdapter
from herdsman.runtime.runner.protocols.registry import (
    detect_protocol,
    make_adapter,
    make_renderer,
)

__all__ = [
    "PLAIN_REPLY_LIMIT",
    "ClaudeAdapter",
    "ClaudeRenderer",
    "CodexAdapter",
    "CodexRenderer",
    "LogText",
    "PlainAdapter",
    "ProtocolAdapter",
    "StreamRenderer",
    "Verdict",
    "describe_exit",
    "detect_protocol",
    "make_adapter",
    "make_renderer",
]
