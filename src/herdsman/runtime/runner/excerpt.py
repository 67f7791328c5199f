"""A bounded excerpt of a run's output: head, failure lines from the middle, tail.

The builder sees the output as it streams and never holds more than a few KiB,
however much the process prints. The excerpt it produces is at most
``EXCERPT_LIMIT`` bytes of UTF-8:

* an output that fits comes back whole, byte for byte (decoded with
  ``errors="replace"``);
* a longer one becomes its first lines (the head), a note saying how many lines
  were elided, the elided lines that contain a failure marker (prefixed with
  their line number; the first two and the last four such lines are kept), and
  its last lines (the tail).

Lines are assembled per stream, so a stdout line and a stderr line written at
the same moment are never spliced into one.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Final

EXCERPT_LIMIT: Final = 4096
"""The most bytes (UTF-8) an excerpt may take."""

FAILURE_MARKERS: Final = (
    "error",
    "exception",
    "traceback",
    "fatal",
    "panic",
    "failed",
    "denied",
    "killed",
)
"""Words (matched case-insensitively, also inside words such as ``ValueError``)
that make an elided line worth keeping."""


def has_failure_marker(line: str) -> bool:
    """Whether ``line`` contains one of ``FAILURE_MARKERS``, in any case."""
    # Plain substring tests on the lowered line: a case-insensitive regex
    # alternation was ~50x slower on long lines, and every line passes here.
    lowered = line.lower()
    for marker in FAILURE_MARKERS:  # a loop: any() over a generator took longer
        if marker in lowered:
            return True
    return False


# The budgets below add up to well under EXCERPT_LIMIT (head 1024 + tail 1536 +
# six marker lines of at most ~180 bytes + the note), and text() still cuts at
# the limit as a last resort, so the bound never depends on getting them right.
_HEAD_BYTES: Final = 1024
_TAIL_BYTES: Final = 1536
_LINE_BYTES: Final = 512  # longest line shown in the head or the tail
_MARKER_LINE_BYTES: Final = 160
_MARKERS_FIRST: Final = 2
_MARKERS_LAST: Final = 4
_PENDING_BYTES: Final = 4096  # the longest partial line buffered per stream
_ELLIPSIS: Final = "…"
_ELLIPSIS_BYTES: Final = len(_ELLIPSIS.encode("utf-8"))


def clip_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8, never inside a character."""
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", errors="ignore")


def _shorten(text: str, limit: int, *, truncated: bool = False) -> str:
    """``text`` within ``limit`` bytes, ending in an ellipsis if anything was cut."""
    if not truncated and len(text.encode("utf-8")) <= limit:
        return text
    return clip_utf8(text, limit - _ELLIPSIS_BYTES) + _ELLIPSIS


class _Lines:
    """Head, tail ring and kept marker lines: everything but the raw buffers."""

    def __init__(self) -> None:
        self.count = 0
        self.head: list[str] = []
        self.head_bytes = 0
        self.head_open = True
        # (line number, shown text, size in bytes with its newline, has a marker)
        self.tail: deque[tuple[int, str, int, bool]] = deque()
        self.tail_bytes = 0
        self.elided = 0
        self.matching = 0
        self.first_markers: list[tuple[int, str]] = []
        self.last_markers: deque[tuple[int, str]] = deque(maxlen=_MARKERS_LAST)

    def add(self, raw: bytes, *, truncated: bool) -> None:
        self.count += 1
        text = raw.decode("utf-8", errors="replace")
        if text.endswith("\r"):
            text = text[:-1]
        # _shorten(text, _LINE_BYTES, truncated=truncated) and its size, with
        # one encode instead of two, and none for ASCII (most lines), where
        # characters and bytes are one and the same.
        size = len(text) if raw.isascii() else len(text.encode("utf-8"))
        if truncated or size > _LINE_BYTES:
            shown = clip_utf8(text, _LINE_BYTES - _ELLIPSIS_BYTES) + _ELLIPSIS
            size = len(shown.encode("utf-8"))
        else:
            shown = text
        size += 1  # the newline
        if self.head_open and self.head_bytes + size <= _HEAD_BYTES:
            self.head.append(shown)
            self.head_bytes += size
            return
        # The head stays contiguous: once one line does not fit, it is closed.
        self.head_open = False
        self.tail.append((self.count, shown, size, has_failure_marker(text)))
        self.tail_bytes += size
        while self.tail_bytes > _TAIL_BYTES:
            number, old, old_size, marked = self.tail.popleft()
            self.tail_bytes -= old_size
            self.elided += 1
            if marked:
                self.matching += 1
                kept = (number, _shorten(old, _MARKER_LINE_BYTES))
                if len(self.first_markers) < _MARKERS_FIRST:
                    self.first_markers.append(kept)
                else:
                    self.last_markers.append(kept)

    def render(self) -> str:
        parts = list(self.head)
        if self.elided:
            kept = self.first_markers + list(self.last_markers)
            if self.matching > len(kept):
                matching = f"{len(kept)} of {self.matching} matching lines kept"
            else:
                matching = f"{len(kept)} matching lines kept"
            noun = "line" if self.elided == 1 else "lines"
            parts.append(f"{_ELLIPSIS} [{self.elided} {noun} elided; {matching}] {_ELLIPSIS}")
            parts.extend(f"[line {number}] {text}" for number, text in kept)
        parts.extend(shown for _, shown, _, _ in self.tail)
        return "\n".join(parts)


class ExcerptBuilder:
    """Builds a bounded excerpt from output fed to it chunk by chunk.

    Feed every chunk with :meth:`feed` (naming the stream it came from); call
    :meth:`text` at any time for the excerpt of everything fed so far. Memory
    stays bounded regardless of how much is fed: a raw buffer of at most
    ``EXCERPT_LIMIT`` bytes (dropped once the output outgrows it), one partial
    line per stream of at most 4 KiB, and the head, tail and marker lines.
    """

    def __init__(self) -> None:
        self._whole: bytearray | None = bytearray()
        self._pending: dict[str, bytearray] = {}
        self._pending_cut: dict[str, bool] = {}
        self._lines = _Lines()

    def feed(self, data: bytes, stream: str = "stdout") -> None:
        """Take the next chunk of ``stream``'s output."""
        if self._whole is not None:
            # Decoding never shrinks the byte count (a replacement character
            # takes 3 bytes), so raw output over the limit cannot fit decoded.
            if len(self._whole) + len(data) <= EXCERPT_LIMIT:
                self._whole += data
            else:
                self._whole = None
        pending = self._pending.get(stream)
        if pending is None:
            pending = self._pending[stream] = bytearray()
        lines = self._lines
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            if pending:
                self._append_pending(stream, pending, data[start:newline])
                lines.add(bytes(pending), truncated=self._pending_cut[stream])
                pending.clear()
                self._pending_cut[stream] = False
            # A whole line in this chunk goes straight in, cut as
            # _append_pending would have cut it (an empty pending line is
            # never a cut one).
            elif newline - start <= _PENDING_BYTES:
                lines.add(data[start:newline], truncated=False)
            else:
                lines.add(data[start : start + _PENDING_BYTES], truncated=True)
            start = newline + 1
        self._append_pending(stream, pending, data[start:])

    def _append_pending(self, stream: str, pending: bytearray, piece: bytes) -> None:
        room = _PENDING_BYTES - len(pending)
        if len(piece) > room:
            piece = piece[: max(room, 0)]
            self._pending_cut[stream] = True
        else:
            self._pending_cut.setdefault(stream, False)
        pending += piece

    def text(self) -> str:
        """The excerpt of everything fed so far (partial last lines included)."""
        if self._whole is not None:
            whole = self._whole.decode("utf-8", errors="replace")
            if len(whole.encode("utf-8")) <= EXCERPT_LIMIT:
                return whole
        lines = self._lines
        partial = [(s, p) for s, p in self._pending.items() if p or self._pending_cut.get(s)]
        if partial:
            # Partial lines count as lines here without disturbing the builder,
            # which may still be fed after this call.
            lines = copy.deepcopy(lines)
            for stream, pending in partial:
                lines.add(bytes(pending), truncated=self._pending_cut.get(stream, False))
        return clip_utf8(lines.render(), EXCERPT_LIMIT)
