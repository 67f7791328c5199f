"""Random sequences of ``config set/add/remove`` on the shipped example and a corpus.

Every edit either is refused and leaves the file byte-identical, or writes a
file that loads, means exactly the old data with that one change, and differs
from the old text in one contiguous run of lines that touches no comment or
header it had no business touching.
"""

from __future__ import annotations

import copy
import difflib
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from herdsman.config import (
    ConfigError,
    add_element,
    load_config_text,
    parse_key_path,
    remove_key,
    set_value,
)
from herdsman.config.overrides import parse_value_text

ROOT = Path(__file__).resolve().parents[3]
CORPUS = sorted((Path(__file__).parent / "edit_corpus").glob("*.toml"))
FILES = [ROOT / "supervisor.toml.example", *CORPUS]

# Values as a user types them, valid and not, for each setting the edits touch.
VALUES: dict[str, list[str]] = {
    "concurrency": ["1", "3", "64", "0", "65", "true", '"2"'],
    "timeout": ["15m", "2h", "0", '"0"', "1.5h", "5"],
    "idle_timeout": ["30m", "0s", "soon"],
    "exec": ['["agent"]', '["agent", "--flag"]', "[]", '[""]'],
    "protocol": ["plain", "claude", "bogus"],
    "max_concurrency": ["2", "0"],
    "shutdown_grace": ["1m", "never"],
    "name": ["extra", "x y", "one", "app"],
    "path": ["/src/elsewhere", '""'],
    "window": ["5h", "0"],
    "budget": ["10", "-1"],
    "idle": ["3d", "x"],
    "listen": ["127.0.0.1:7100", "nowhere"],
    "TOKEN": ['"t"', "1"],
}
LEAVES = {
    "provider": ["concurrency", "timeout", "idle_timeout", "exec", "protocol", "env.TOKEN"],
    "supervisor": ["max_concurrency", "shutdown_grace"],
    "repo": ["name", "path"],
    "account": ["name", "window", "budget", "concurrency"],
}
TYPOS = ["providers.claud.concurrency", "supervisr.max_concurrency", "repos[9].path", "api.lisen"]


def values_for(key: str) -> list[str]:
    return VALUES[key.rpartition(".")[2]]


def data_of(text: str) -> dict[str, Any]:
    return tomllib.loads(text)


def providers(data: dict[str, Any]) -> list[str]:
    return sorted(data.get("providers", {}))


@st.composite
def edits(draw: st.DrawFn, data: dict[str, Any]) -> tuple[str, str, list[str]]:
    """One edit (operation, key, arguments) that fits the file's current data."""
    names = providers(data)
    repos = data.get("repos", [])
    options: list[tuple[str, str, list[str]]] = []
    for typo in TYPOS:
        options.append(("set", typo, ["1"]))
    for field in LEAVES["supervisor"]:
        options.extend(("set", f"supervisor.{field}", [v]) for v in values_for(field))
    options.extend(("set", "retention.idle", [v]) for v in values_for("idle"))
    options.extend(("set", "api.listen", [v]) for v in values_for("listen"))
    options.append(("set", "providers.added.exec", ['["added"]']))
    for name in names:
        for field in LEAVES["provider"]:
            key = f"providers.{name}.{field}"
            options.extend(("set", key, [v]) for v in values_for(field))
        options.append(("remove", f"providers.{name}", []))
        options.append(("remove", f"providers.{name}.concurrency", []))
        options.append(("add", f"providers.{name}.accounts", ["name=extra", "window=5h"]))
        options.append(("add", f"providers.{name}.accounts", ["name=x y"]))
        accounts = data["providers"][name].get("accounts", [])
        for number in range(len(accounts)):
            for field in LEAVES["account"]:
                key = f"providers.{name}.accounts[{number}].{field}"
                options.extend(("set", key, [v]) for v in values_for(field))
            options.append(("remove", f"providers.{name}.accounts[{number}]", []))
    for number in range(len(repos)):
        for field in LEAVES["repo"]:
            options.extend(("set", f"repos[{number}].{field}", [v]) for v in values_for(field))
        options.append(("remove", f"repos[{number}]", []))
    options.append(("add", "repos", ["name=added", "path=/src/added"]))
    options.append(("add", "repos", ["name=added", "pth=/src/added"]))
    options.append(("remove", "repos", []))
    return draw(st.sampled_from(options))


def expected_data(data: dict[str, Any], operation: str, key: str, args: list[str]) -> Any:
    """What the file must mean after the edit, worked out on plain data."""
    changed = copy.deepcopy(data)
    path = parse_key_path(key)
    node: Any = changed
    for part in path[:-1]:
        node = node[part] if isinstance(part, int) else node.setdefault(part, {})
    last = path[-1]
    if operation == "set":
        node[last] = parse_value_text(args[0])
    elif operation == "add":
        element: dict[str, Any] = {}
        for arg in args:
            field, _, value = arg.partition("=")
            element[field] = parse_value_text(value)
        node.setdefault(last, []).append(element)
    else:
        del node[last]
        if isinstance(last, int) and not node:  # the last element: the array goes too
            parent: Any = changed
            for part in path[:-2]:
                parent = parent[part]
            del parent[path[-2]]
    return changed


def only_removed(line: str, before: str) -> bool:
    """Whether ``line`` is ``before`` with characters taken out (spacing aside)."""
    rest = iter("".join(before.split()))
    return all(char in rest for char in "".join(line.split()))


def check_layout(old: str, new: str, operation: str) -> None:
    """The change is where the edit is; comments and headers elsewhere are kept."""
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    hunks = [
        op
        for op in difflib.SequenceMatcher(None, old_lines, new_lines).get_opcodes()
        if op[0] != "equal"
    ]
    if not hunks:
        assert old == new  # a value set to what it was
        return
    if operation == "remove":
        # Pure deletions, each leaving at most what is left of an edited line
        # (an inline table without the key). A table written in two places
        # (out of order) leaves two.
        for _, start, end, new_start, new_end in hunks:
            for line in new_lines[new_start:new_end]:
                assert any(only_removed(line, gone) for gone in old_lines[start:end]), line
        return
    # A set or an add: one place, and no comment or header dropped there.
    start, end = hunks[0][1], hunks[-1][2]
    new_start, new_end = hunks[0][3], hunks[-1][4]
    assert all(not line.strip() for line in old_lines[hunks[0][2] : hunks[-1][1]]), hunks
    kept = [line.strip() for line in new_lines[new_start:new_end]]
    for line in old_lines[start:end]:
        if line.strip().startswith(("#", "[")):
            assert line.strip() in kept, (line, kept)
    if start == end and 0 < start < len(old_lines):
        # Not wedged between a comment and the header it leads into.
        leads_in = old_lines[start - 1].strip().startswith("#")
        assert not (leads_in and old_lines[start].strip().startswith("[")), new_lines[new_start]
    first = next((n for n in range(new_start, new_end) if new_lines[n].strip()), None)
    if first is not None and first > 0 and new_lines[first].lstrip().startswith("["):
        assert not new_lines[first - 1].strip(), "a new table has a blank line before it"


def apply(operation: str, path: Path, key: str, args: list[str]) -> None:
    actions: dict[str, Callable[[], object]] = {
        "set": lambda: set_value(path, key, args[0], environ={}),
        "add": lambda: add_element(path, key, args, environ={}),
        "remove": lambda: remove_key(path, key, environ={}),
    }
    actions[operation]()


@pytest.mark.parametrize("source", FILES, ids=[path.name for path in FILES])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_edit_sequences_keep_everything_else(source: Path, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "supervisor.toml"
        path.write_bytes(source.read_bytes())
        for _ in range(data.draw(st.integers(1, 4), label="edits")):
            before = path.read_bytes()
            old = before.decode()
            operation, key, args = data.draw(edits(data_of(old)), label="edit")
            try:
                apply(operation, path, key, args)
            except ConfigError:
                event(f"{operation} refused")
                assert path.read_bytes() == before
                assert sorted(p.name for p in path.parent.iterdir()) == ["supervisor.toml"]
                continue
            event(f"{operation} written")
            new = path.read_bytes().decode()
            load_config_text(new, path, environ={})
            assert data_of(new) == expected_data(data_of(old), operation, key, args)
            check_layout(old, new, operation)
