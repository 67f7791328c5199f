"""supervisor.toml.example and docs/configuration.md stay complete and valid."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from herdsman.config import Config, environment_warnings, load_config
from herdsman.config.kinds import ArrayOfTables, NamedTables, Table
from herdsman.executables import scripts_dir

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "supervisor.toml.example"
REFERENCE = ROOT / "docs" / "configuration.md"


def _documented_keys(cls: type = Config, prefix: str = "") -> list[str]:
    keys: list[str] = []
    for field in attrs.fields(cls):
        kind = field.metadata["kind"]
        key = f"{prefix}{field.name}"
        if isinstance(kind, Table):
            keys += _documented_keys(kind.cls, f"{key}.")
        elif isinstance(kind, NamedTables):
            keys += _documented_keys(kind.item.cls, f"{key}.NAME.")
        elif isinstance(kind, ArrayOfTables):
            keys += _documented_keys(kind.item.cls, f"{key}[].")
        else:
            keys.append(key)
    return keys


ALL_KEYS = _documented_keys()


def test_the_example_loads_with_only_path_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    loaded = load_config(EXAMPLE, environ={})
    assert loaded.config.providers["claude"].exec[0] == "claude"
    assert loaded.config.providers["codex"].protocol == "codex"
    # The demo agent is found beside herdsman itself, whatever PATH says.
    assert loaded.config.providers["demo"].exec[0] == "herdsman-demo-agent"
    warnings = environment_warnings(loaded)
    assert [re.sub(r"^.*?: ", "", w, count=1) for w in warnings] == [
        f"providers.claude.exec: 'claude' was not found on PATH nor in {scripts_dir()}",
        f"providers.codex.exec: 'codex' was not found on PATH nor in {scripts_dir()}",
    ]


def test_the_example_makes_no_worktree_of_this_clone_and_spends_no_placeholder_account() -> None:
    loaded = load_config(EXAMPLE, environ={})
    # No repo: a conversation's run gets no worktree (nor a branch) of anything.
    assert loaded.config.repos == ()
    # No account: runs use the CLI's own login, not a folder that is not there.
    assert all(not provider.accounts for provider in loaded.config.providers.values())


def test_the_examples_codex_runs_outside_a_git_checkout_and_ends() -> None:
    codex = load_config(EXAMPLE, environ={}).config.providers["codex"]
    # codex exec refuses a folder that is not a git checkout without the flag.
    assert "--skip-git-repo-check" in codex.exec
    # Without network it retries for ever: a limit must end it.
    assert codex.timeout is not None


_COMMENTED_TABLE = re.compile(
    r"^# (\[\[.*\]\]|(?:name|env|window|budget|budget_unit|concurrency|path) = .*)$",
    re.MULTILINE,
)


def test_the_commented_out_accounts_and_repo_load_once_uncommented(tmp_path: Path) -> None:
    # The guidance is true: uncommented (and their placeholder paths made), they are valid.
    text = _COMMENTED_TABLE.sub(r"\1", EXAMPLE.read_text())
    text = text.replace("/home/you", str(tmp_path))
    copy = tmp_path / "supervisor.toml"
    copy.write_text(text)
    loaded = load_config(copy, environ={})
    accounts = loaded.config.providers["claude"].accounts
    assert [account.name for account in accounts] == ["work", "personal"]
    assert [repo.name for repo in loaded.config.repos] == ["app"]


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_key_appears_in_the_example(key: str) -> None:
    name = key.rpartition(".")[2]
    assert re.search(rf"^#? ?{re.escape(name)} = ", EXAMPLE.read_text(), re.MULTILINE), key


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_key_is_in_the_reference(key: str) -> None:
    assert f"`{key}`" in REFERENCE.read_text(), key
