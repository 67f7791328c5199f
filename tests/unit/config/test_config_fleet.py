# ruff: noqa: E501  -- expected error lines are kept whole, as users see them.
"""The ``[fleet]`` table: defaults, values, and every mistake located and explained."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from herdsman.config import LoadedConfig

Load = Callable[..., LoadedConfig]
Errors = Callable[..., list[str]]

PROVIDERS = """\
[providers.claude]
exec = ["claude", "-p"]
[[providers.claude.accounts]]
name = "work"
[[providers.claude.accounts]]
name = "home"
[providers.codex]
exec = ["codex"]
"""
STORE = '[store]\nurl = "postgresql://db.example/herdsman"\n'


def test_fleet_mode_is_off_by_default_with_a_30s_lease(load: Load) -> None:
    fleet = load(PROVIDERS).config.fleet
    assert fleet.enabled is False
    assert fleet.lease == timedelta(seconds=30)
    assert fleet.poll == timedelta(seconds=1)
    assert fleet.provider_caps == {}
    assert fleet.account_caps == {}


def test_a_full_fleet_table_is_read(load: Load) -> None:
    loaded = load(
        PROVIDERS
        + STORE
        + '[fleet]\nenabled = true\nlease = "1m"\npoll = "2s"\n'
        + "provider_caps = { claude = 4 }\n"
        + "account_caps = { claude = { work = 2, home = 1 } }\n"
    )
    fleet = loaded.config.fleet
    assert (fleet.enabled, fleet.lease, fleet.poll) == (
        True,
        timedelta(minutes=1),
        timedelta(seconds=2),
    )
    assert fleet.provider_caps == {"claude": 4}
    assert fleet.account_caps == {"claude": {"work": 2, "home": 1}}
    assert loaded.toml_values["fleet.account_caps"] == {"claude": {"work": 2, "home": 1}}
    assert loaded.toml_values["fleet.lease"] == "1m"


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        (
            "enabled = true\n",
            [
                'supervisor.toml:10:11: fleet.enabled: fleet mode needs a PostgreSQL ledger the members share, but store.url is not set; add [store] url = "postgresql://HOST/DATABASE"'
            ],
        ),
        (
            'enabled = "yes"\n',
            ['supervisor.toml:10:11: fleet.enabled: must be true or false, got "yes"'],
        ),
        (
            'lease = "2s"\n',
            ['supervisor.toml:10:9: fleet.lease: must be from "3s" to "1h", got "2s"'],
        ),
        (
            'lease = "2h"\n',
            ['supervisor.toml:10:9: fleet.lease: must be from "3s" to "1h", got "2h"'],
        ),
        (
            'lease = "0"\n',
            [
                'supervisor.toml:10:9: fleet.lease: must be a duration such as "90s", "15m", "1h30m", "14d" (greater than zero), got "0"'
            ],
        ),
        (
            'lease = "10s"\npoll = "10s"\n',
            [
                'supervisor.toml:11:8: fleet.poll: must be shorter than the lease (fleet.lease (supervisor.toml:10:9)), got "10s"'
            ],
        ),
        (
            "provider_caps = { claude = 0, cladue = 2, codex = true }\n",
            [
                "supervisor.toml:10:28: fleet.provider_caps.claude: must be a whole number of at least 1, got 0",
                # Reported although another entry has the wrong kind.
                "supervisor.toml:10:31: fleet.provider_caps.cladue: names no provider of this file; the providers are: claude, codex",
                "supervisor.toml:10:51: fleet.provider_caps.codex: must be a whole number of at least 1, got true",
            ],
        ),
        (
            "provider_caps = { cladue = 2 }\n",
            [
                "supervisor.toml:10:19: fleet.provider_caps.cladue: names no provider of this file; the providers are: claude, codex"
            ],
        ),
        (
            "provider_caps = 4\n",
            [
                "supervisor.toml:10:17: fleet.provider_caps: must be a table of whole numbers, e.g. { claude = 4 }, got 4"
            ],
        ),
        (
            "account_caps = { claude = 2 }\n",
            [
                "supervisor.toml:10:27: fleet.account_caps.claude: must be a table of whole numbers, e.g. { claude = 4 }, got 2"
            ],
        ),
        (
            "account_caps = { claude = { wrok = 1, work = -1 }, codex = { x = 1 }, nope = {} }\n",
            [
                "supervisor.toml:10:29: fleet.account_caps.claude.wrok: names no account of providers.claude; its accounts are: home, work",
                "supervisor.toml:10:46: fleet.account_caps.claude.work: must be a whole number of at least 1, got -1",
                "supervisor.toml:10:62: fleet.account_caps.codex.x: names no account of providers.codex; its accounts are: (none)",
                "supervisor.toml:10:71: fleet.account_caps.nope: names no provider of this file; the providers are: claude, codex",
            ],
        ),
        (
            "account_caps = { nope = 2, claude = { wrok = 1 } }\n",
            [
                "supervisor.toml:10:18: fleet.account_caps.nope: names no provider of this file; the providers are: claude, codex",
                "supervisor.toml:10:25: fleet.account_caps.nope: must be a table of whole numbers, e.g. { claude = 4 }, got 2",
                "supervisor.toml:10:39: fleet.account_caps.claude.wrok: names no account of providers.claude; its accounts are: home, work",
            ],
        ),
        (
            "account_caps = { claude = { wrok = 1 }, codex = { x = 1 }, nope = {} }\n",
            [
                "supervisor.toml:10:29: fleet.account_caps.claude.wrok: names no account of providers.claude; its accounts are: home, work",
                "supervisor.toml:10:51: fleet.account_caps.codex.x: names no account of providers.codex; its accounts are: (none)",
                "supervisor.toml:10:60: fleet.account_caps.nope: names no provider of this file; the providers are: claude, codex",
            ],
        ),
        (
            'leese = "5s"\n',
            ["supervisor.toml:10:1: fleet.leese: unknown key; did you mean 'lease'?"],
        ),
    ],
)
def test_fleet_mistakes_are_located_and_explained(
    errors: Errors, fleet: str, expected: list[str]
) -> None:
    assert errors(PROVIDERS + "[fleet]\n" + fleet) == expected


def test_enabled_without_a_store_url_given_by_set_names_the_override(errors: Errors) -> None:
    assert errors(PROVIDERS, ["fleet.enabled=true"]) == [
        '--set fleet.enabled=true: fleet.enabled: fleet mode needs a PostgreSQL ledger the members share, but store.url is not set; add [store] url = "postgresql://HOST/DATABASE"'
    ]
