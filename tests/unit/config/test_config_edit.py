# ruff: noqa: E501  -- expected error lines are kept whole, as users see them.
"""``config set``: in-place, byte-exact outside the value, validated, atomic."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herdsman.config import ConfigError, set_value
from herdsman.config.edit import atomic_write

ORIGINAL = """\
# herdsman config — hand-written, with odd spacing on purpose
[supervisor]
max_concurrency   =   4      # machine-wide

[providers.claude]   # the main one
exec = [ "claude",  "-p" ]
concurrency = 2 # keep low
  timeout = '2h'

[[providers.claude.accounts]]
name = "work"

[api]
listen = "127.0.0.1:7878"
"""


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "supervisor.toml"
    path.write_text(ORIGINAL)
    path.chmod(0o640)
    return path


def replaced(old: str, new: str) -> str:
    assert ORIGINAL.count(old) == 1
    return ORIGINAL.replace(old, new)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("providers.claude.concurrency", "5", replaced("concurrency = 2 #", "concurrency = 5 #")),
        ("supervisor.max_concurrency", "12", replaced("=   4   ", "=   12   ")),
        ("providers.claude.timeout", "90m", replaced("timeout = '2h'", 'timeout = "90m"')),
        ("providers.claude.exec", '["claude"]', replaced('[ "claude",  "-p" ]', '["claude"]')),
        ("api.listen", "[::1]:9000", replaced('"127.0.0.1:7878"', '"[::1]:9000"')),
    ],
)
def test_only_the_value_changes(config_file: Path, key: str, value: str, expected: str) -> None:
    result = set_value(config_file, key, value)
    assert config_file.read_text() == expected
    assert result.old_text == ORIGINAL
    assert result.new_text == expected


def test_new_keys_in_an_array_of_tables_are_appended_to_that_element(config_file: Path) -> None:
    set_value(config_file, "providers.claude.accounts[0].window", "5h")
    assert config_file.read_text() == replaced('name = "work"\n', 'name = "work"\nwindow = "5h"\n')


def test_setting_a_key_of_a_new_provider_creates_its_table(config_file: Path) -> None:
    set_value(config_file, "providers.codex.exec", '["codex", "exec", "--json", "-"]')
    # After the last provider's tables, a blank line before and after; nothing else moves.
    assert config_file.read_text() == replaced(
        'name = "work"\n\n[api]',
        'name = "work"\n\n[providers.codex]\nexec = ["codex", "exec", "--json", "-"]\n\n[api]',
    )


def test_setting_in_a_new_table_on_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.toml"
    path.write_text("")
    set_value(path, "providers.claude.exec", '["claude"]')
    assert path.read_text() == '[providers.claude]\nexec = ["claude"]\n'


def test_crlf_files_keep_their_line_endings(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.toml"
    path.write_bytes(b'[providers.claude]\r\nexec = ["claude"]\r\nconcurrency = 1\r\n')
    set_value(path, "providers.claude.concurrency", "3")
    assert path.read_bytes() == b'[providers.claude]\r\nexec = ["claude"]\r\nconcurrency = 3\r\n'


def test_permission_bits_are_kept(config_file: Path) -> None:
    set_value(config_file, "providers.claude.concurrency", "3")
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o640


def test_a_symlinked_file_is_edited_through_the_link(config_file: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.toml"
    link.symlink_to(config_file)
    set_value(link, "providers.claude.concurrency", "3")
    assert link.is_symlink()
    assert "concurrency = 3 #" in config_file.read_text()


def test_no_temporary_files_are_left_behind(config_file: Path) -> None:
    set_value(config_file, "providers.claude.concurrency", "3")
    assert sorted(p.name for p in config_file.parent.iterdir()) == ["supervisor.toml"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "providers.claude.concurrency",
            "0",
            "supervisor.toml:7:15: providers.claude.concurrency: must be a whole number from 1 to 64, got 0",
        ),
        (
            "providers.claude.concurency",
            "3",
            "providers.claude.concurency: unknown key; did you mean 'concurrency'?",
        ),
        (
            "providers.claude.accounts[0].budget",
            "3",
            "supervisor.toml:12:10: providers.claude.accounts[0].budget: requires a window to count it "
            'in, e.g. window = "5h"; window is not set',
        ),
        (
            "providers.codex.concurrency",
            "1",
            "providers.codex: not in supervisor.toml; the names there are: claude "
            "(to add a new one, set providers.codex.exec first)",
        ),
        (
            "providers.claud.concurrency",
            "1",
            "providers.claud: not in supervisor.toml; did you mean 'claude'? "
            "(to add a new one, set providers.claud.exec first)",
        ),
        (
            "providers.claude.accounts[4].name",
            '"x"',
            "providers.claude.accounts has no element [4]; it has 1 ([0])",
        ),
        ("supervisor.max_concurrency.x", "1", "supervisor.max_concurrency has no part 'x'"),
        ("repos", "[]", "repos: is an array of tables; set a field of one element"),
    ],
)
def test_a_refused_edit_leaves_the_file_untouched(
    config_file: Path, key: str, value: str, message: str
) -> None:
    before = config_file.read_bytes()
    before_stat = config_file.stat()
    with pytest.raises(ConfigError) as caught:
        set_value(config_file, key, value)
    assert str(caught.value).rpartition(os.sep)[2].startswith(message)
    assert config_file.read_bytes() == before
    assert config_file.stat().st_mtime_ns == before_stat.st_mtime_ns
    assert config_file.stat().st_ino == before_stat.st_ino


def test_a_file_with_a_syntax_error_is_reported_not_edited(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.toml"
    path.write_text("a = = 1\n")
    with pytest.raises(ConfigError, match=r"supervisor\.toml:1:5: invalid TOML"):
        set_value(path, "supervisor.max_concurrency", "1")
    assert path.read_text() == "a = = 1\n"


def test_an_edit_can_repair_an_invalid_file(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.toml"
    path.write_text('[providers.claude]\nexec = ["claude"]\nconcurrency = 0\n')
    set_value(path, "providers.claude.concurrency", "1")
    assert path.read_text() == '[providers.claude]\nexec = ["claude"]\nconcurrency = 1\n'


def test_atomic_write_cleans_up_when_writing_fails(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_fsync(_: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(config_file, "replacement")
    assert config_file.read_text() == ORIGINAL
    assert sorted(p.name for p in config_file.parent.iterdir()) == ["supervisor.toml"]


@given(st.integers(min_value=1, max_value=64))
def test_any_valid_concurrency_changes_exactly_that_value(concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "supervisor.toml"
        path.write_text(ORIGINAL)
        set_value(path, "providers.claude.concurrency", str(concurrency))
        assert path.read_text() == replaced("concurrency = 2 #", f"concurrency = {concurrency} #")


@given(st.integers().filter(lambda n: not 1 <= n <= 64))
def test_any_out_of_range_concurrency_is_refused(concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "supervisor.toml"
        path.write_text(ORIGINAL)
        with pytest.raises(ConfigError, match=f"got {concurrency}$"):
            set_value(path, "providers.claude.concurrency", str(concurrency))
        assert path.read_text() == ORIGINAL
