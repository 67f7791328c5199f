"""``check`` output: the aligned listing and the JSON document."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from herdsman.config import ConfigError, LoadedConfig, load_config_text
from herdsman.config.report import check_json, check_text

Load = Callable[..., LoadedConfig]
TEXT = '[providers.claude]\nexec = ["claude", "-p"]\nconcurrency = 3\n'


def test_listing_shows_each_value_with_its_origin_aligned(load: Load) -> None:
    loaded = load(TEXT, ["providers.claude.timeout=1h"], environ={"XDG_STATE_HOME": "/s"})
    loaded.warnings.append("a warning")
    lines = check_text(loaded).splitlines()
    assert lines[0] == f"{loaded.path}: valid"
    assert "[providers.claude]" in lines
    rows = {line.split()[0]: line for line in lines if line.startswith("  ")}
    cells = {key: re.split(r"\s{2,}", row.strip()) for key, row in rows.items()}
    assert cells["exec"] == ["exec", '["claude", "-p"]', f"{loaded.path}:2"]
    assert cells["concurrency"] == ["concurrency", "3", f"{loaded.path}:3"]
    assert cells["timeout"] == ["timeout", "1h", "--set"]
    assert cells["state_dir"] == ["state_dir", "/s/herdsman", "default"]
    assert cells["max_concurrency"] == ["max_concurrency", "(not set)", "default"]
    # Origins start in one column for every short value.
    columns = {
        rows[key].index(origin)
        for key, origin in [("concurrency", str(loaded.path)), ("timeout", "--set")]
    }
    assert len(columns) == 1
    assert lines[-2:] == ["warnings:", "  a warning"]


def test_json_for_a_valid_config(load: Load) -> None:
    document = check_json(load(TEXT, environ={"XDG_STATE_HOME": "/s"}))
    assert json.loads(json.dumps(document)) == document
    assert document["valid"] is True
    assert document["errors"] == []
    values = document["config"]["values"]
    assert values["providers"]["claude"]["concurrency"] == 3
    assert values["providers"]["claude"]["idle_timeout"] == "15m"
    assert values["trace"]["dir"] == "/s/herdsman/traces"
    assert document["config"]["origins"]["providers.claude.concurrency"].endswith(
        "supervisor.toml:3"
    )
    assert document["config"]["origins"]["api.listen"] == "default"


def test_json_for_an_invalid_config() -> None:
    try:
        load_config_text(TEXT + "concurrency = 0\n", Path("supervisor.toml"), environ={})
    except ConfigError as error:
        document = check_json(None, error.problems)
    assert document == {
        "format": 1,
        "valid": False,
        "path": None,
        "config": None,
        "warnings": [],
        "errors": [
            {
                "location": "supervisor.toml:4:1",
                "key": "",
                "message": 'invalid TOML: Key "concurrency" already exists.',
                "text": 'supervisor.toml:4:1: invalid TOML: Key "concurrency" already exists.',
            }
        ],
    }
