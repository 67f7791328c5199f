"""``herdsman logs``: a run's log, as recorded, turned into readable text."""

from __future__ import annotations

from typing import Final

from herdsman.runtime.runner.protocols.base import StreamRenderer
from herdsman.runtime.runner.protocols.registry import detect_protocol, make_renderer

PENDING_LIMIT: Final = 8 * 1024 * 1024
"""The longest partial line held back while following a log; longer ones are shown as they are."""


class LogText:
    """Renders a log fed in chunks (as ``logs --follow`` reads it), line by line.

    The renderer is chosen by the first line that is an agent CLI's event
    (``detect``), so lines before it (banners, stderr) pass through as they
    are, and a log with no such line (a plain CLI's, or an agent that failed
    before its stream started) is shown as recorded.
    """

    def __init__(self) -> None:
        self._renderer: StreamRenderer | None = None
        self._partial = b""

    def feed(self, data: bytes) -> str:
        """The text for the whole lines in ``data`` (a partial last line waits)."""
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < PENDING_LIMIT:
            self._partial = data
            return ""
        whole, self._partial = (data[:cut], data[cut:]) if cut else (data + b"\n", b"")
        return "".join(self._line(line) for line in whole.decode("utf-8", "replace").splitlines())

    def finish(self) -> str:
        """The text for a partial last line (a run stopped mid-line, a truncated log)."""
        rest, self._partial = self._partial, b""
        return self._line(rest.decode("utf-8", "replace")) if rest else ""

    def _line(self, line: str) -> str:
        if self._renderer is None:
            protocol = detect_protocol(line)
            if protocol is None:
                return line + "\n"
            self._renderer = make_renderer(protocol)
        return "".join(f"{text}\n" for text in self._renderer.render(line))
