"""ExcerptBuilder: the 4 KiB bound, whole short outputs, failure lines from the middle."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from herdsman.runtime.runner.excerpt import (
    EXCERPT_LIMIT,
    FAILURE_MARKERS,
    ExcerptBuilder,
    clip_utf8,
    has_failure_marker,
)

# Output-like bytes: mostly text and newlines, with marker words, multibyte
# characters and invalid UTF-8 mixed in.
_pieces = st.one_of(
    st.binary(max_size=300),
    st.sampled_from([b"\n", b"\r\n", b"Error: boom\n", "ünïcödé ✓ ".encode(), b"\xff\xfe"]),
    st.text(max_size=200).map(lambda t: t.encode("utf-8")),
)
_feeds = st.lists(st.tuples(_pieces, st.sampled_from(["stdout", "stderr"])), max_size=60)


def _feed_all(feeds: list[tuple[bytes, str]]) -> ExcerptBuilder:
    builder = ExcerptBuilder()
    for data, stream in feeds:
        builder.feed(data, stream)
    return builder


@given(_feeds, st.integers(min_value=0, max_value=200))
def test_the_excerpt_never_exceeds_4_kib(feeds: list[tuple[bytes, str]], repeat: int) -> None:
    builder = _feed_all(feeds)
    for _ in range(repeat):  # plenty of output, well past the whole-output buffer
        builder.feed(b"x" * 97 + b" error\n", "stdout")
    assert len(builder.text().encode("utf-8")) <= EXCERPT_LIMIT


@given(_feeds)
def test_an_output_that_fits_comes_back_whole(feeds: list[tuple[bytes, str]]) -> None:
    output = b"".join(data for data, _ in feeds)
    decoded = output.decode("utf-8", errors="replace")
    builder = _feed_all(feeds)
    if len(decoded.encode("utf-8")) <= EXCERPT_LIMIT:
        assert builder.text() == decoded
    else:
        assert len(builder.text().encode("utf-8")) <= EXCERPT_LIMIT


@given(st.binary(min_size=1, max_size=5000), st.integers(min_value=1, max_value=700))
def test_chunking_does_not_change_a_short_excerpt(data: bytes, size: int) -> None:
    whole = ExcerptBuilder()
    whole.feed(data)
    chunked = ExcerptBuilder()
    for start in range(0, len(data), size):
        chunked.feed(data[start : start + size])
    assert chunked.text() == whole.text()


def test_failure_lines_from_the_elided_middle_are_kept_with_their_numbers() -> None:
    builder = ExcerptBuilder()
    for i in range(1, 2001):
        builder.feed(f"ordinary line {i}\n".encode())
        if i == 700:
            builder.feed(b"Traceback (most recent call last):\n")  # line 701
        if i == 1200:
            builder.feed(b"PermissionError: access DENIED\n")  # line 1202
    text = builder.text()
    assert len(text.encode()) <= EXCERPT_LIMIT
    assert text.startswith("ordinary line 1\nordinary line 2\n")
    assert text.endswith("ordinary line 2000")
    assert "lines elided; 2 matching lines kept] …" in text
    assert "[line 701] Traceback (most recent call last):" in text
    assert "[line 1202] PermissionError: access DENIED" in text


def test_many_failure_lines_keep_the_first_two_and_the_last_four() -> None:
    builder = ExcerptBuilder()
    for i in range(1, 3001):
        builder.feed(f"step {i} failed\n".encode() if i % 100 == 0 else f"step {i}\n".encode())
    text = builder.text()
    kept = [line for line in text.splitlines() if line.startswith("[line ")]
    # Lines 100 and 2900 are in the head and the tail, shown as they are; the
    # numbered ones come from the elided middle (200 to 2800: 27 of them).
    assert "\nstep 100 failed\n" in text
    assert "\nstep 2900 failed\n" in text
    assert kept == [
        "[line 200] step 200 failed",
        "[line 300] step 300 failed",
        "[line 2500] step 2500 failed",
        "[line 2600] step 2600 failed",
        "[line 2700] step 2700 failed",
        "[line 2800] step 2800 failed",
    ]
    assert "6 of 27 matching lines kept" in text


def test_lines_of_two_streams_are_not_spliced() -> None:
    builder = ExcerptBuilder()
    builder.feed(b"out-start ", "stdout")
    builder.feed(b"err line\n", "stderr")
    builder.feed(b"out-end\n" + b"filler\n" * 1000, "stdout")
    text = builder.text()
    assert text.startswith("err line\nout-start out-end\nfiller\n")


def test_an_endless_line_is_held_in_bounded_memory_and_shown_cut() -> None:
    builder = ExcerptBuilder()
    for _ in range(1000):
        builder.feed(b"y" * 10_000)
    assert all(len(pending) <= 4096 for pending in builder._pending.values())
    text = builder.text()
    assert text.startswith("yyy")
    assert text.endswith("…")
    assert len(text.encode()) <= EXCERPT_LIMIT


def test_the_marker_list_is_documented_and_case_insensitive() -> None:
    assert FAILURE_MARKERS == (
        "error",
        "exception",
        "traceback",
        "fatal",
        "panic",
        "failed",
        "denied",
        "killed",
    )
    assert has_failure_marker("ValueError: bad")
    assert has_failure_marker("FATAL")
    assert has_failure_marker("Killed")
    assert not has_failure_marker("all good")


def test_clip_utf8_never_cuts_a_character() -> None:
    assert clip_utf8("ü" * 10, 5) == "üü"
    assert clip_utf8("abc", 10) == "abc"
