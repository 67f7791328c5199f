# ruff: noqa: E501  -- expected error lines are kept whole, as users see them.
"""Every error: one line, file:line:col, key path, what is wrong and what is right."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyfakefs.fake_filesystem_unittest import Patcher

from herdsman.config import ConfigError, load_config

Errors = Callable[..., list[str]]
MINIMAL = '[providers.claude]\nexec = ["claude", "-p"]\n'
ACCOUNT = '[[providers.claude.accounts]]\nname = "a"\nwindow = "5h"\n'

BROKEN = """\
# test
[supervisor]
max_concurrency = true
shutdown_grace = "10 minutes"
colour = "blue"

[providers.claude]
exec = []
concurency = 3
concurrency = 0
timeout = 5
protocol = "cluade"
usage_limit_pattern = "(unclosed"
env = { FOO = 1 }

[[providers.claude.accounts]]
name = "a"
budget = 5

[[providers.claude.accounts]]
name = "a"
window = "0"

[providers.x]
concurrency = 1.5

[[repos]]
name = "r"
path = "."
[[repos]]
name = "r"
[[repos]]
path = ".."
name = ".."

[api]
listen = "::1:7878"

[trace]
max_bytes = 100
dir = ""
"""

DURATION = 'a duration such as "90s", "15m", "1h30m", "14d" or "0"'
POSITIVE = 'a duration such as "90s", "15m", "1h30m", "14d" (greater than zero)'
EXEC = 'a non-empty list of strings, e.g. ["claude", "-p"]'


def test_all_errors_reported_at_once_in_file_order(errors: Errors) -> None:
    assert errors(BROKEN) == [
        "supervisor.toml:3:19: supervisor.max_concurrency: must be a whole number of at least 1, got true",
        f'supervisor.toml:4:18: supervisor.shutdown_grace: must be {DURATION}, got "10 minutes"',
        "supervisor.toml:5:1: supervisor.colour: unknown key; "
        "expected one of: state_dir, max_concurrency, shutdown_grace, parallel_preamble",
        f"supervisor.toml:8:8: providers.claude.exec: must be {EXEC}, got []",
        "supervisor.toml:9:1: providers.claude.concurency: unknown key; did you mean 'concurrency'?",
        "supervisor.toml:10:15: providers.claude.concurrency: must be a whole number from 1 to 64, got 0",
        f"supervisor.toml:11:11: providers.claude.timeout: must be {DURATION}, got 5",
        'supervisor.toml:12:12: providers.claude.protocol: must be one of "plain", "claude" or "codex", '
        'got "cluade"',
        "supervisor.toml:13:23: providers.claude.usage_limit_pattern: must be a valid regular expression, "
        'got "(unclosed": missing ), unterminated subpattern at position 0',
        "supervisor.toml:14:15: providers.claude.env.FOO: must be a string, got 1",
        "supervisor.toml:18:10: providers.claude.accounts[0].budget: requires a window to count it in, "
        'e.g. window = "5h"; window is not set',
        'supervisor.toml:21:8: providers.claude.accounts[1].name: duplicate name "a" in this provider; '
        "already used by providers.claude.accounts[0].name (supervisor.toml:17:8); names must be unique",
        f'supervisor.toml:22:10: providers.claude.accounts[1].window: must be {POSITIVE}, got "0"',
        f"supervisor.toml:24:1: providers.x: missing required key 'exec' ({EXEC})",
        "supervisor.toml:25:15: providers.x.concurrency: must be a whole number from 1 to 64, got 1.5",
        "supervisor.toml:30:1: repos[1]: missing required key 'path' (a non-empty path string)",
        'supervisor.toml:31:8: repos[1].name: duplicate name "r"; already used by repos[0].name '
        "(supervisor.toml:28:8); names must be unique",
        'supervisor.toml:34:8: repos[2].name: must not be ".."',
        'supervisor.toml:37:10: api.listen: must put an IPv6 address in brackets, e.g. "[::1]:7878", '
        'got "::1:7878"',
        "supervisor.toml:40:13: trace.max_bytes: must be a whole number of at least 4096, got 100",
        'supervisor.toml:41:7: trace.dir: must be a non-empty path string, got ""',
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            MINIMAL + "concurrency = 65\n",
            "supervisor.toml:3:15: providers.claude.concurrency: must be a whole number from 1 to 64, got 65",
        ),
        (
            MINIMAL + "concurrency = false\n",
            "supervisor.toml:3:15: providers.claude.concurrency: must be a whole number from 1 to 64, "
            "got false",
        ),
        (
            MINIMAL + 'concurrency = "2"\n',
            "supervisor.toml:3:15: providers.claude.concurrency: must be a whole number from 1 to 64, "
            'got "2"',
        ),
        (
            '[providers.claude]\nexec = "claude -p"\n',
            f'supervisor.toml:2:8: providers.claude.exec: must be {EXEC}, got "claude -p"',
        ),
        (
            '[providers.claude]\nexec = ["claude", ""]\n',
            'supervisor.toml:2:19: providers.claude.exec[1]: must be a non-empty string, got ""',
        ),
        (
            '[providers."two words"]\nexec = ["x"]\n',
            "supervisor.toml:1:12: providers.\"two words\": name must be made of letters, digits, '_' and '-'",
        ),
        (
            MINIMAL + "[scheduling]\nagent_exclusive = 1\n",
            "supervisor.toml:4:19: scheduling.agent_exclusive: must be true or false, got 1",
        ),
        (
            MINIMAL + '[retention]\nsweep_interval = "0"\n',
            f'supervisor.toml:4:18: retention.sweep_interval: must be {POSITIVE}, got "0"',
        ),
        (
            MINIMAL + '[api]\nlisten = "localhost:0"\n',
            "supervisor.toml:4:10: api.listen: must be HOST:PORT with a port from 1 to 65535, "
            'e.g. "127.0.0.1:7878" or "[::1]:7878", got "localhost:0"',
        ),
        (
            MINIMAL + '[api]\nlisten = "[::g]:80"\n',
            "supervisor.toml:4:10: api.listen: must be HOST:PORT with a port from 1 to 65535, "
            'e.g. "127.0.0.1:7878" or "[::1]:7878", got "[::g]:80"',
        ),
        (
            MINIMAL + '[[providers.claude.accounts]]\nname = "a b"\n',
            "supervisor.toml:4:8: providers.claude.accounts[0].name: must be a name of letters, digits, "
            "'_', '.' and '-', got \"a b\"",
        ),
        (
            MINIMAL + '[[providers.claude.accounts]]\nwindow = "1h"\n',
            "supervisor.toml:3:1: providers.claude.accounts[0]: missing required key 'name' "
            "(a name of letters, digits, '_', '.' and '-')",
        ),
        (
            MINIMAL + '[[providers.claude.accounts]]\nname = "a"\nbudget_unit = "minutes"\n',
            'supervisor.toml:5:15: providers.claude.accounts[0].budget_unit: must be one of "runs", '
            '"run_minutes", "tokens" or "usd", got "minutes"',
        ),
        (
            MINIMAL + 'protocol = "claude"\n' + ACCOUNT + 'budget = 2.5\nbudget_unit = "tokens"\n',
            "supervisor.toml:7:10: providers.claude.accounts[0].budget: must be a whole number of "
            'tokens with budget_unit = "tokens" (only budget_unit = "usd" takes dollars and cents), '
            "got 2.5",
        ),
        (
            MINIMAL + ACCOUNT + "budget = 0.5\n",
            "supervisor.toml:6:10: providers.claude.accounts[0].budget: must be a whole number of "
            'runs with budget_unit = "runs" (only budget_unit = "usd" takes dollars and cents), '
            "got 0.5",
        ),
        (
            MINIMAL + 'protocol = "claude"\n' + ACCOUNT + 'budget = -20\nbudget_unit = "usd"\n',
            "supervisor.toml:7:10: providers.claude.accounts[0].budget: must be a number greater "
            "than zero, got -20",
        ),
        (
            MINIMAL + 'protocol = "claude"\n' + ACCOUNT + 'budget = "5M"\nbudget_unit = "tokens"\n',
            "supervisor.toml:7:10: providers.claude.accounts[0].budget: must be a number greater "
            'than zero, got "5M"',
        ),
        (
            MINIMAL + 'protocol = "codex"\n' + ACCOUNT + 'budget = 20\nbudget_unit = "usd"\n',
            'supervisor.toml:8:15: providers.claude.accounts[0].budget_unit: "usd" counts what the '
            'agent\'s stream states, and a protocol = "codex" stream states no cost; use one of '
            '"runs", "run_minutes", "tokens" (or protocol = "claude" if the provider is Claude Code)',
        ),
        (
            MINIMAL + ACCOUNT + 'budget = 5000000\nbudget_unit = "tokens"\n',
            'supervisor.toml:7:15: providers.claude.accounts[0].budget_unit: "tokens" counts what '
            'the agent\'s stream states, and a protocol = "plain" stream states no token counts; '
            'use one of "runs", "run_minutes" (or protocol = "claude" if the provider is Claude '
            "Code)",
        ),
        (
            MINIMAL + "[providrs.codex]\n",
            "supervisor.toml:3:2: providrs: unknown key; did you mean 'providers'?",
        ),
        (
            MINIMAL + "[trace]\nmax_bytes = 2024-01-01\n",
            "supervisor.toml:4:13: trace.max_bytes: must be a whole number of at least 4096, "
            "got a date/time (2024-01-01)",
        ),
        (
            "supervisor = 3\n" + MINIMAL,
            "supervisor.toml:1:14: supervisor: must be a table, got 3",
        ),
        (
            "[supervisor]\nmax_concurrency = 2\n",
            "supervisor.toml:1:1: providers: at least 1 provider is required, e.g. "
            '[providers.claude] with exec = ["claude", "-p"]',
        ),
        (
            MINIMAL + "[providers.claude.retry]\nattempts = 0\n",
            "supervisor.toml:4:12: providers.claude.retry.attempts: must be a whole number from 1 "
            "to 20, got 0",
        ),
        (
            MINIMAL + '[providers.claude.retry]\non = ["overloaded", "529"]\n',
            "supervisor.toml:4:21: providers.claude.retry.on[1]: must be one of "
            '"overloaded", "server_error", "rate_limit", "connection", "api_error", '
            '"idle_timeout" or "crash", got "529"',
        ),
        (
            MINIMAL + '[providers.claude.retry]\non = "crash"\n',
            "supervisor.toml:4:6: providers.claude.retry.on: must be a list of "
            '"overloaded", "server_error", "rate_limit", "connection", "api_error", '
            '"idle_timeout", "crash", got "crash"',
        ),
        (
            MINIMAL + '[providers.claude.retry]\non = ["crash", "crash"]\n',
            'supervisor.toml:4:16: providers.claude.retry.on[1]: "crash" is listed twice',
        ),
        (
            MINIMAL + '[providers.claude.retry]\nafter_work = ["crash"]\n',
            'supervisor.toml:4:15: providers.claude.retry.after_work[0]: lists "crash", which on '
            "does not retry: add it to on, or remove it here",
        ),
        (
            MINIMAL + '[providers.claude.retry]\nbackoff = "0"\n',
            f'supervisor.toml:4:11: providers.claude.retry.backoff: must be {POSITIVE}, got "0"',
        ),
        (
            MINIMAL + '[providers.claude.retry]\nbackoff = "2m"\nbackoff_max = "1m"\n',
            "supervisor.toml:5:15: providers.claude.retry.backoff_max: must be at least backoff "
            "(2m), got 1m",
        ),
        (
            MINIMAL + "[providers.claude.retry]\nattempt = 3\n",
            "supervisor.toml:4:1: providers.claude.retry.attempt: unknown key; did you mean "
            "'attempts'?",
        ),
        (
            MINIMAL + 'env = { "" = "x" }\n',
            'supervisor.toml:3:9: providers.claude.env."": must be an environment variable name '
            "(no '=', not empty)",
        ),
    ],
)
def test_single_errors(errors: Errors, text: str, expected: str) -> None:
    assert errors(text) == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a = = 1\n", "supervisor.toml:1:5: invalid TOML: Unexpected character: '='"),
        (
            MINIMAL + "concurrency = 1\n  concurrency = 2\n[api]\n",
            'supervisor.toml:4:3: invalid TOML: Key "concurrency" already exists.',
        ),
        (
            MINIMAL + "[api]\n[providers.claude]\n",
            'supervisor.toml:4:2: invalid TOML: Key "claude" already exists.',
        ),
        (
            MINIMAL + 'env = { A = "1", A = "2" }\n',
            'supervisor.toml:3:18: invalid TOML: Key "A" already exists.',
        ),
        (
            '[providers.claude\nexec = ["x"]\n',
            "supervisor.toml:1:18: invalid TOML: Unexpected character: '\\n'",
        ),
        # tomlkit lets this through (a sub-table between the two headers);
        # the TOML spec, and so every other reader, does not.
        (
            MINIMAL
            + "[api]\n[providers.claude.env]\nA = '1'\n[providers.claude]\ntimeout = '1h'\n",
            "supervisor.toml:6:18: invalid TOML: Cannot declare ('providers', 'claude') twice",
        ),
    ],
)
def test_toml_syntax_errors_are_located(errors: Errors, text: str, expected: str) -> None:
    assert errors(text) == [expected]


STORE = MINIMAL + "[store]\nurl = "
EXAMPLE_URL = "'postgresql://herdsman@db.example:5432/herdsman'"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            '"mysql://db/herdsman"',
            f"store.url: must be a PostgreSQL URL starting with postgresql://, e.g. {EXAMPLE_URL};"
            " got 'mysql://db/herdsman' (leave [store] url out to keep the ledger in SQLite in state_dir)",
        ),
        (
            "5432",
            'store.url: must be a PostgreSQL URL, e.g. "postgresql://herdsman@db.example:5432/herdsman", got 5432',
        ),
        (
            '"postgresql:///herdsman"',
            f"store.url: must name the server's host, e.g. {EXAMPLE_URL} (or ?host=/var/run/postgresql"
            " for a local socket); got 'postgresql:///herdsman'",
        ),
        (
            '"postgresql://db"',
            f"store.url: must name the database after the host, e.g. {EXAMPLE_URL}; got 'postgresql://db'",
        ),
        (
            '"postgresql://db:70000/herdsman"',
            "store.url: has port '70000'; a port is a number from 1 to 65535: 'postgresql://db:70000/herdsman'",
        ),
        (
            '"postgresql://db/herdsman?sslmod=require"',
            'store.url: is not a URL libpq can read (invalid URI query parameter: "sslmod"):'
            " 'postgresql://db/herdsman?sslmod=require'",
        ),
        (
            '"postgresql://herdsman:hunter2@db/herdsman"',
            "store.url: must not contain a password (herdsman check, traces and reload reports show"
            " this value); put it in ~/.pgpass or the PGPASSWORD environment variable instead;"
            " got 'postgresql://herdsman:***@db/herdsman'",
        ),
        (
            '"postgresql://db/herdsman?password=hunter2"',
            "store.url: must not contain a password (herdsman check, traces and reload reports show"
            " this value); put it in ~/.pgpass or the PGPASSWORD environment variable instead;"
            " got 'postgresql://db/herdsman?password=***'",
        ),
    ],
)
def test_a_bad_store_url_is_located_and_explained(errors: Errors, url: str, expected: str) -> None:
    # The value starts on line 4, column 7, whatever it is.
    assert errors(STORE + url + "\n") == [f"supervisor.toml:4:7: {expected}"]
    assert "hunter2" not in expected


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "supervisor.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(missing, environ={})
    assert str(caught.value) == f"{missing}: cannot read file: No such file or directory"


def test_unreadable_file_is_one_line() -> None:
    # pyfakefs enforces permissions even when the tests run as root.
    with Patcher(allow_root_user=False) as patcher:
        assert patcher.fs is not None
        patcher.fs.create_file("/etc/herdsman/supervisor.toml", st_mode=0o100000, contents=MINIMAL)
        with pytest.raises(ConfigError) as caught:
            load_config(Path("/etc/herdsman/supervisor.toml"), environ={})
    assert str(caught.value) == "/etc/herdsman/supervisor.toml: cannot read file: Permission denied"


def test_a_directory_is_not_a_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, environ={})
    assert str(caught.value) == (
        f"{tmp_path}: cannot read file: a directory, not a regular file;"
        " name the configuration file itself"
    )


def test_non_utf8_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.toml"
    path.write_bytes(b"a = '\xff'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    assert (
        str(caught.value)
        == f"{path}: cannot read file: not UTF-8 text (invalid start byte at byte 5)"
    )


def test_nul_characters_in_exec_and_env_are_refused(errors: Errors) -> None:
    text = (
        "[providers.claude]\n"
        'exec = ["claude", "-\\u0000p"]\n'
        'env = { X = "a\\u0000b" }\n'
        'resume_args = ["--resume\\u0000", "{session}"]\n'
    )
    assert errors(text) == [
        "supervisor.toml:2:19: providers.claude.exec[1]: must not contain a NUL character",
        "supervisor.toml:3:13: providers.claude.env.X: must not contain a NUL character",
        "supervisor.toml:4:16: providers.claude.resume_args[0]: must not contain a NUL character",
    ]
