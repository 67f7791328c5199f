"""``sim plan`` reports what the agents spend and decides SLO clauses on it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sim_workloads import CONFIG, herdsman

from herdsman.cli import main
from herdsman.sim.metrics import Metrics
from herdsman.sim.plan import PlanResult, collect, plan, read_input
from herdsman.sim.plan_report import plan_figure, plan_json, plan_table
from herdsman.sim.slo import SloError, parse_slo
from herdsman.sim.sweep import parse_vary

SPEND_FLAGS = [
    "--tokens",
    "claude=input:30k,cache_read:500k,output:10k,sigma:0.4",
    "--token-prices",
    "claude=input:3,cache_read:0.3,output:15",
    "--failures",
    "overloaded=0.05,crash=0.02",
]


def generated(tmp_path: Path, *more: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    out = tmp_path / "workload.jsonl"
    argv = ["sim", "generate", "-c", str(tmp_path / "supervisor.toml"), "--span", "6h"]
    argv += ["--arrivals", "poisson:6", "--durations", "lognormal:10m,1.0"]
    argv += ["--providers", "claude=1", "--out", str(out), *more]
    assert main(argv) == 0
    return out


def run_plan(workload: Path, slo: str, replications: int = 3, **more: object) -> PlanResult:
    return plan(
        read_input(workload),
        [parse_vary("providers.claude.concurrency=1..3")],
        parse_slo(slo),
        replications=replications,
        **more,  # type: ignore[arg-type]
    )


def metrics(spend_per_day: float) -> Metrics:
    return Metrics(60, 60, 60, 60, 0.5, 10, 0, 0, 0, spend_per_day=spend_per_day)


@pytest.mark.parametrize(
    ("days", "verdict"),
    [
        ((40.0, 42.0, 44.0), "meets"),  # the whole interval under $50
        ((60.0, 62.0, 64.0), "misses"),  # the whole interval over it
        ((10.0, 50.0, 90.0), "undecided"),  # it straddles $50
        ((50.0, 50.0, 50.0), "meets"),  # <= holds at the threshold itself
    ],
)
def test_a_spend_clause_decides_by_the_whole_interval(
    days: tuple[float, float, float], verdict: str
) -> None:
    combos = [(("providers.claude.concurrency", "1"),)]
    results = {(0, r): metrics(day) for r, day in enumerate(days)}
    slo = parse_slo("p95_wait<=5m,spend_per_day<=$50")
    (row,) = collect(combos, results, 3, slo)
    assert row.verdict == verdict
    # The wait clause holds throughout: the spend clause alone decides.
    assert parse_slo("p95_wait<=5m").verdict(row.estimates) == "meets"


@pytest.mark.parametrize(
    ("text", "metric", "value"),
    [
        ("spend_per_day<=50", "spend_per_day", 50.0),
        ("spend_per_day<=$12.5", "spend_per_day", 12.5),
        ("spend_per_run<0.25", "spend_per_run", 0.25),
        ("tokens_per_day<=3.1M", "tokens_per_day", 3_100_000.0),
        ("tokens_per_run<=500k", "tokens_per_run", 500_000.0),
        ("tokens_per_day<=1200", "tokens_per_day", 1200.0),
    ],
)
def test_spend_clauses_take_dollars_and_token_counts(text: str, metric: str, value: float) -> None:
    (clause,) = parse_slo(text).clauses
    assert (clause.metric, clause.value) == (metric, value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "cost_per_day<=50",
            "--slo: unknown metric 'cost_per_day'; expected one of p50_wait",
        ),
        ("tokens_per_day<=3T", "expected a token count such as 500000, 500k or 3.1M"),
        ("spend_per_day<=-5", "expected US dollars >= 0 such as 50 or $12.5, got '-5'"),
        ("spend_per_day<=$$5", "expected US dollars >= 0"),
    ],
)
def test_a_bad_spend_clause_says_what_would_do(text: str, message: str) -> None:
    with pytest.raises(SloError) as raised:
        parse_slo(text)
    assert message in str(raised.value)
    if text.startswith("cost_"):
        # Never confused with --cost, the configuration's price.
        assert "what the agents spend in dollars is spend_per_day" in str(raised.value)
        assert "--cost prices the configuration itself" in str(raised.value)


def test_the_table_reports_spend_per_day_and_per_run_and_the_answers_spend(
    tmp_path: Path,
) -> None:
    workload = generated(tmp_path, *SPEND_FLAGS)
    result = run_plan(workload, "p95_wait<=10h,spend_per_day<=$1000")
    table = plan_table(result)
    head = table.splitlines()[0]
    assert re.search(r"spend/day\s+tokens/day\s+spend/run\s+tokens/run\s+meets SLO$", head)
    first = table.splitlines()[1]
    assert re.search(r"\$\d+\.\d\d ±\$\d+\.\d\d", first), first
    assert re.search(r"\d+(\.\d)?M ±\d+(\.\d)?[kM]", first), first
    assert "spend_per_day mean + half <= $1,000.00" in table
    assert "spend: what the agents burn (tokens; US dollars" in table
    answer = table.splitlines()[-1]
    assert answer.startswith("smallest configuration meeting p95_wait<=10h,spend_per_day<=$1000:")
    assert re.search(r"its agents spend \$[\d,]+\.\d\d/day and \d+(\.\d)?M tokens/day$", answer)
    row = result.answer
    assert row is not None
    assert f"${row.estimates['spend_per_day'].mean:,.2f}/day" in answer


def test_a_tight_spend_clause_rejects_every_configuration(tmp_path: Path) -> None:
    workload = generated(tmp_path, *SPEND_FLAGS)
    result = run_plan(workload, "p95_wait<=10h,spend_per_day<=0.01")
    assert all(row.verdict == "misses" for row in result.rows)
    assert result.answer is None
    assert plan_table(result).splitlines()[-1] == (
        "no configuration meets p95_wait<=10h,spend_per_day<=0.01"
    )


def test_cost_a_month_and_spend_stay_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generated(tmp_path, *SPEND_FLAGS)
    argv = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1..2"]
    argv += ["--slo", "p95_wait<=10h", "--replications", "2", "--workers", "1"]
    argv += ["--cost", "providers.claude.concurrency=40"]
    assert main(argv) in (0, 1)
    out = capsys.readouterr().out
    assert "cost/month" in out.splitlines()[0]
    assert "spend/day" in out.splitlines()[0]
    assert "; not cost/month, which is what --cost prices" in out
    assert re.search(r", \d+ a month; its agents spend \$", out.splitlines()[-1])


def test_json_has_the_spend_metrics_only_with_a_spend_model(tmp_path: Path) -> None:
    spent_path, plain_path = generated(tmp_path / "s", *SPEND_FLAGS), generated(tmp_path / "p")
    spent, plain = run_plan(spent_path, "p95_wait<=10h"), run_plan(plain_path, "p95_wait<=10h")
    spent_json = plan_json(spent, read_input(spent_path))
    plain_json = plan_json(plain, read_input(plain_path))
    names = set(spent_json["configurations"][0]["metrics"])
    assert {"spend_per_day", "tokens_per_day", "spend_per_run", "tokens_per_run"} <= names
    assert not {"spend_per_day", "tokens_per_day"} & set(plain_json["configurations"][0]["metrics"])
    assert "spend" not in plan_table(plain)
    day = spent_json["configurations"][0]["metrics"]["spend_per_day"]
    assert day["mean"] > 0
    assert len(day["values"]) == 3


def test_the_plot_draws_the_spend_under_the_wait(tmp_path: Path) -> None:
    workload = generated(tmp_path, *SPEND_FLAGS)
    result = run_plan(workload, "p95_wait<=10h,spend_per_day<=$1000")
    waits, spend = plan_figure(result).axes
    assert waits.get_ylabel().startswith("p95_wait")
    assert spend.get_ylabel() == "spend_per_day ($/day)"
    assert spend.get_ylim()[0] == 0
    slo = [line for line in spend.lines if line.get_label() == "SLO spend_per_day<=$1000"]
    assert len(slo) == 1
    gids = {line.get_gid() for line in spend.lines if line.get_gid()}
    assert gids == {
        f"providers.claude.concurrency={row.setting[0][1]}|{row.verdict}" for row in result.rows
    }
    plain = run_plan(generated(tmp_path / "plain"), "p95_wait<=10h")
    assert len(plan_figure(plain).axes) == 1


def test_spend_is_the_same_for_any_number_of_workers(tmp_path: Path) -> None:
    workload = generated(tmp_path, *SPEND_FLAGS)
    args = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1..2"]
    args += ["--slo", "p95_wait<=1h,spend_per_day<=$200", "--replications", "auto:10", "--json"]
    one = herdsman(*args, "--workers", "1", cwd=tmp_path, hash_seed="1")
    two = herdsman(*args, "--workers", "2", cwd=tmp_path, hash_seed="2")
    assert one.returncode in (0, 1), one.stderr
    assert (two.returncode, two.stdout) == (one.returncode, one.stdout)
    assert json.loads(one.stdout)["configurations"][0]["metrics"]["spend_per_day"]["mean"] > 0
