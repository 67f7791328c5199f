"""What runs spent, end to end: a real supervisor, the demo agent speaking Claude Code's stream.

The demo agent's ``result`` line reports tokens, cost and per-model usage as
Claude Code's does; the test reads them back from ``runs``, ``runs RUN_ID``,
the API's run JSON, ``/metrics``, the trace's finish events and ``herdsman
usage``, each through the real command line or HTTP.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_support import CLI, Supervisor, herdsman
from supervisor_support import write_config

from herdsman.config import load_config

TALK = (
    f'\n[providers.talk]\nexec = ["{sys.executable}", "-m", "herdsman.demo_agent",'
    ' "--delay", "0", "--protocol", "claude"]\nprotocol = "claude"\n'
)


def spent_by_demo(prompt: str, reply: str) -> tuple[int, int, float]:
    """Input and output tokens and cost the demo agent reports (its _spent's arithmetic)."""
    tokens_in, tokens_out = len(prompt) // 4 + 1, len(reply) // 4 + 1
    return tokens_in, tokens_out, round((tokens_in * 3 + tokens_out * 15) / 1e6, 6)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A supervisor that ran three runs: two that report their spend, one that cannot."""
    directory = tmp_path_factory.mktemp("usage")
    write_config(directory, delay=0, extra_provider=TALK)
    supervisor = Supervisor(directory)
    try:
        for run_id, provider, conversation, prompt in (
            ("u1", "talk", "c1", "hello there"),
            ("u2", "talk", "c2", "a somewhat longer prompt, to spend more"),
            ("u3", "demo", "c1", "plain"),  # plain text: no spend reported
        ):
            done = herdsman(
                "submit",
                *CLI,
                "-p",
                provider,
                "--id",
                run_id,
                "--conversation",
                conversation,
                "--wait",
                prompt,
                cwd=directory,
            )
            assert done.returncode == 0, done.stderr
        yield directory
        assert supervisor.stop() == 0
    finally:
        supervisor.close()


def cli_json(workdir: Path, *args: str) -> Any:
    done = herdsman(*args, *CLI, "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_run_shows_what_its_stream_said_it_spent(workdir: Path) -> None:
    tokens_in, tokens_out, cost = spent_by_demo("hello there", "demo reply: hello there")
    run = cli_json(workdir, "runs", "u1")
    tokens = {
        "input": tokens_in,
        "cache_read": 0,
        "cache_write": 0,
        "output": tokens_out,
        "reasoning": 0,
        "total": tokens_in + tokens_out,
    }
    assert run["spend"] == {
        "tokens": tokens,
        "cost_usd": cost,
        "turns": 1,
        "api_time": 0.0,
        "models": [{"model": "demo", "tokens": tokens, "cost_usd": cost}],
    }
    assert cli_json(workdir, "runs", "u3")["spend"] is None
    shown = herdsman("runs", *CLI, "u1", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    assert f"spend:        {tokens_in + tokens_out:,} tokens ({tokens_in} input" in shown.stdout
    assert f"· ${cost:.4f} · 1 turn" in shown.stdout
    assert f"\n    demo: {tokens_in} input · {tokens_out} output · ${cost:.4f}\n" in shown.stdout


def test_the_runs_table_has_what_each_run_spent(workdir: Path) -> None:
    listed = herdsman("runs", *CLI, cwd=workdir)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[5:7] == ["took", "spent"]
    by_id = {row.split()[0]: row.split() for row in rows}
    _, _, cost = spent_by_demo("hello there", "demo reply: hello there")
    # The submitted cell is a date and a time: two fields.
    assert by_id["u1"][7] == f"${cost:.4f}"
    assert by_id["u3"][7] == "-"


def test_a_spent_cell_without_a_cost_shows_the_tokens_in_short() -> None:
    from herdsman.spend_text import spent_cell, tokens_short

    assert [tokens_short(n) for n in (0, 850, 12_345, 123_456, 4_500_000)] == [
        "0",
        "850",
        "12.3k",
        "123k",
        "4.5M",
    ]
    tokens = {"total": 12_345}
    assert spent_cell({"cost_usd": None, "tokens": tokens}) == "12.3k"
    assert spent_cell({"cost_usd": 12.5, "tokens": tokens}) == "$12.50"
    assert spent_cell({"cost_usd": None, "tokens": None}) == ""
    assert spent_cell(None) == ""


def test_usage_sums_the_ledger_by_provider_model_and_conversation(workdir: Path) -> None:
    one = spent_by_demo("hello there", "demo reply: hello there")
    two = spent_by_demo(
        "a somewhat longer prompt, to spend more",
        "demo reply: a somewhat longer prompt, to spend more",
    )
    totals = cli_json(workdir, "usage")
    assert totals["by"] == "provider"
    assert totals["since"] is None
    [talk] = totals["totals"]  # the plain demo run spent nothing it said
    assert (talk["group"], talk["runs"], talk["priced"], talk["turns"]) == ("talk", 2, 2, 2)
    assert talk["tokens"]["input"] == one[0] + two[0]
    assert talk["tokens"]["output"] == one[1] + two[1]
    assert talk["cost_usd"] == pytest.approx(one[2] + two[2])
    by_model = cli_json(workdir, "usage", "--by", "model", "--since", "1h")
    assert [(t["group"], t["runs"]) for t in by_model["totals"]] == [("demo", 2)]
    by_conversation = cli_json(workdir, "usage", "--by", "conversation")
    assert [(t["workspace"], t["group"], t["runs"]) for t in by_conversation["totals"]] == [
        ("default", "c1", 1),
        ("default", "c2", 1),
    ]
    table = herdsman("usage", *CLI, "--by", "account", cwd=workdir)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "account",
        "runs",
        "attempts",
        "input",
        "cache",
        "read",
        "cache",
        "write",
        "output",
        "cost",
    ]
    assert row.split() == [
        "(ambient)",
        "2",
        "2",
        str(one[0] + two[0]),
        "0",
        "0",
        str(one[1] + two[1]),
        f"${one[2] + two[2]:.4f}",
    ]
    # Runs that finished before the window are not in it.
    assert cli_json(workdir, "usage", "--since", "1h")["totals"] == totals["totals"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--by", "team"), "argument --by: invalid choice: 'team'"),
        (("--since", "7"), "argument --since: expected a duration back from now"),
        (("--since", "0"), "got '0'"),
        (("--since=-1d",), "got '-1d'"),
    ],
)
def test_a_wrong_flag_is_a_one_line_usage_error(
    workdir: Path, args: tuple[str, ...], said: str
) -> None:
    refused = herdsman("usage", *CLI, *args, cwd=workdir)
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith("herdsman usage: ")
    assert said in refused.stderr


def test_prometheus_counts_tokens_and_cost_by_provider_account_and_model(workdir: Path) -> None:
    config = load_config(workdir / "supervisor.toml", []).config
    token = config.api.token_file.read_text().strip()
    scraped = httpx.get(
        f"http://{config.api.listen}/metrics",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert scraped.status_code == 200
    one = spent_by_demo("hello there", "demo reply: hello there")
    two = spent_by_demo(
        "a somewhat longer prompt, to spend more",
        "demo reply: a somewhat longer prompt, to spend more",
    )
    labels = 'account="",kind="input",model="demo",provider="talk"'
    assert f"herdsman_tokens_total{{{labels}}} {float(one[0] + two[0])}" in scraped.text
    cost = [
        line
        for line in scraped.text.splitlines()
        if line.startswith('herdsman_cost_usd_total{account="",model="demo",provider="talk"}')
    ]
    assert len(cost) == 1
    assert float(cost[0].split()[-1]) == pytest.approx(one[2] + two[2])
    assert 'provider="demo"' not in "".join(
        line for line in scraped.text.splitlines() if line.startswith("herdsman_tokens_total")
    )


def test_the_traces_finish_events_carry_the_spend(workdir: Path) -> None:
    finishes = {
        event["run_id"]: event
        for path in sorted((workdir / "state" / "traces").glob("*.jsonl"))
        for event in map(json.loads, path.read_text().splitlines()[1:])
        if event["event"] == "finish"
    }
    assert finishes["u1"]["spend"] == cli_json(workdir, "runs", "u1")["spend"]
    assert "spend" not in finishes["u3"]


def test_usage_leaves_an_older_ledger_as_it_is_and_says_why(tmp_path: Path) -> None:
    """Reading must not upgrade a ledger under the (older) supervisor that writes it."""
    import sqlite3

    from herdsman.runtime.main import DB_NAME
    from herdsman.runtime.store.sqlite import MIGRATIONS

    write_config(tmp_path, delay=0)
    (tmp_path / "state").mkdir()
    old = sqlite3.connect(tmp_path / "state" / DB_NAME)
    for statements in MIGRATIONS[:3]:
        for statement in statements:
            old.execute(statement)
    old.execute("PRAGMA user_version = 3")
    old.commit()
    old.close()

    refused = herdsman("usage", *CLI, cwd=tmp_path)

    assert (refused.returncode, refused.stdout) == (1, ""), refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "has schema version 3, older than this herdsman reads" in refused.stderr
    assert "restart that supervisor with this herdsman" in refused.stderr
    still = sqlite3.connect(tmp_path / "state" / DB_NAME)
    try:
        assert still.execute("PRAGMA user_version").fetchone() == (3,)
        assert "input_tokens" not in {
            row[1] for row in still.execute("PRAGMA table_info(runs)").fetchall()
        }
    finally:
        still.close()


FLAKY = (
    f'\n[providers.flaky]\nexec = ["{sys.executable}", "-m", "herdsman.demo_agent",'
    ' "--delay", "0", "--protocol", "claude", "--overloaded", "1"]\nprotocol = "claude"\n'
    '[providers.flaky.retry]\nbackoff = "1s"\nbackoff_max = "1s"\n'
)


def test_a_retried_run_counts_every_attempt_in_usage_and_says_which_in_runs_id(
    tmp_path: Path,
) -> None:
    """The demo agent's first attempt fails as an overloaded API, after spending; both count."""
    write_config(tmp_path, delay=0, extra_provider=FLAKY)
    supervisor = Supervisor(tmp_path)
    try:
        done = herdsman(
            "submit", *CLI, "-p", "flaky", "--id", "f1", "--wait", "hello there", cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr
        run = cli_json(tmp_path, "runs", "f1")
        shown = herdsman("runs", *CLI, "f1", cwd=tmp_path)
        assert supervisor.stop() == 0
    finally:
        supervisor.close()
    # Attempt 1 read the prompt and wrote nothing (one token); attempt 2 replied.
    first = spent_by_demo("hello there", "")
    second = spent_by_demo("hello there", "demo reply: hello there")
    [earlier] = run["earlier_attempts"]
    assert (run["attempts"], earlier["failure"]) == (2, "overloaded")
    assert earlier["spend"]["cost_usd"] == first[2]
    assert run["spend"]["cost_usd"] == second[2]
    total = run["total_spend"]
    assert total["cost_usd"] == pytest.approx(first[2] + second[2])
    assert total["tokens"]["input"] == first[0] + second[0]
    assert total["tokens"]["output"] == first[1] + second[1]
    assert total["turns"] == 2
    assert [(m["model"], m["tokens"]["output"]) for m in total["models"]] == [
        ("demo", first[1] + second[1])
    ]
    assert shown.returncode == 0, shown.stderr
    assert "— attempt 2 only\n" in shown.stdout, shown.stdout
    assert f"${first[2] + second[2]:.4f} · 2 turns" in shown.stdout
    assert "— all 2 attempts\n" in shown.stdout
    for by in ("provider", "conversation", "account", "model"):
        [group] = cli_json(tmp_path, "usage", "--by", by)["totals"]
        assert (group["runs"], group["attempts"], group["priced"]) == (1, 2, 2), by
        assert group["cost_usd"] == pytest.approx(first[2] + second[2]), by
        assert group["tokens"]["output"] == first[1] + second[1], by
    assert cli_json(tmp_path, "usage", "--since", "1h")["totals"][0]["attempts"] == 2
    table = herdsman("usage", *CLI, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split()[:3] == ["provider", "runs", "attempts"]
    assert row.split()[:3] == ["flaky", "1", "2"]
