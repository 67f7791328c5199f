"""The log file's creation, and excerpts that do not depend on how output was chunked."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runner_helpers import make_spec, script

from herdsman.runtime.runner import execute
from herdsman.runtime.runner.excerpt import EXCERPT_LIMIT, ExcerptBuilder
from herdsman.runtime.runner.spec import Outcome


async def test_missing_log_directories_are_created(tmp_path: Path) -> None:
    spec = make_spec(tmp_path, log_path=tmp_path / "new" / "deeper" / "run.log")
    outcome = await execute(spec)
    assert outcome.status is Outcome.SUCCEEDED
    assert spec.log_path.read_bytes() == b"demo reply: say hello\n"


async def test_an_existing_log_file_is_replaced(tmp_path: Path) -> None:
    log_path = tmp_path / "logs" / "run.log"
    log_path.parent.mkdir()
    log_path.write_bytes(b"an older, longer run's output\n" * 100)
    outcome = await execute(make_spec(tmp_path, log_path=log_path))
    assert outcome.status is Outcome.SUCCEEDED
    assert log_path.read_bytes() == b"demo reply: say hello\n"


async def test_a_log_path_that_cannot_be_created_raises_before_anything_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    marker = tmp_path / "spawned"
    spec = make_spec(
        tmp_path,
        argv=script(f"open({str(marker)!r}, 'w').close()"),
        log_path=tmp_path / "a-file" / "run.log",
    )
    with pytest.raises(NotADirectoryError, match="a-file"):
        await execute(spec)
    assert not marker.exists()


# Line-oriented output well past the whole-output limit, so the excerpt is
# built from lines: short and long lines (around the 512-byte display cut and
# the 4 KiB partial-line bound), CRLF, markers, multibyte and invalid UTF-8.
_lines = st.one_of(
    st.text(alphabet="abc xyzERROR\r", max_size=80),
    st.text(max_size=40),
    st.sampled_from(["Traceback (most recent call last):", "ü" * 300, "x" * 511, "x" * 512]),
    st.integers(min_value=500, max_value=5000).map(lambda n: "y" * n),
).map(lambda line: line.encode("utf-8"))
_outputs = st.lists(
    st.tuples(st.one_of(_lines, st.just(b"\xff\xfe")), st.sampled_from(["stdout", "stderr"])),
    min_size=1,
    max_size=60,
)


@given(_outputs, st.lists(st.integers(min_value=1, max_value=9000), min_size=1, max_size=20))
def test_the_excerpt_does_not_depend_on_the_chunking(
    output: list[tuple[bytes, str]], sizes: list[int]
) -> None:
    streams: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    for line, stream in output * 2:
        streams[stream] += line + b"\n"
    streams["stdout"] += b"a partial last line"
    # Whole lines arrive in one chunk, or in pieces of the given sizes (1 byte
    # pieces go through the partial-line buffer for every line).
    whole, chunked, bytewise = ExcerptBuilder(), ExcerptBuilder(), ExcerptBuilder()
    for stream, data in streams.items():
        whole.feed(bytes(data), stream)
        start = 0
        for n, size in enumerate(sizes * (len(data) // sum(sizes) + 1)):
            if start >= len(data):
                break
            chunked.feed(bytes(data[start : start + size]), stream)
            start += size
            if n % 7 == 0:
                assert len(chunked.text().encode()) <= EXCERPT_LIMIT
        for i in range(len(data)):
            bytewise.feed(bytes(data[i : i + 1]), stream)
    assert chunked.text() == whole.text()
    assert bytewise.text() == whole.text()
    assert len(whole.text().encode()) <= EXCERPT_LIMIT


async def test_a_working_directory_of_herdsmans_own_is_made_one_a_client_named_must_exist(
    tmp_path: Path,
) -> None:
    from herdsman.runtime.runner import execute

    own = tmp_path / "state" / "workspace"
    outcome = await execute(make_spec(tmp_path, cwd=own, make_cwd=True))
    assert outcome.exit_code == 0
    assert own.is_dir()
    named = tmp_path / "not-there"
    with pytest.raises(FileNotFoundError):
        await execute(make_spec(tmp_path, cwd=named))
    assert not named.exists()
