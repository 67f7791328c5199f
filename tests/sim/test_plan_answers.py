"""``sim plan`` answers a team can act on: human units, the rule, auto, costs, the picture."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import LineCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from sim_workloads import CONFIG, herdsman

from herdsman.cli import main
from herdsman.sim.plan import PlanResult, Replications, plan, read_input
from herdsman.sim.plan_report import plan_figure, plan_table
from herdsman.sim.slo import parse_slo
from herdsman.sim.sweep import parse_vary


def generated(tmp_path: Path, span: str = "2h", rate: str = "6", seed: str = "0") -> Path:
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    out = tmp_path / "workload.jsonl"
    argv = ["sim", "generate", "-c", str(tmp_path / "supervisor.toml"), "--span", span]
    argv += ["--arrivals", f"poisson:{rate}", "--durations", "lognormal:10m,1.0"]
    argv += ["--providers", "claude=1", "--seed", seed, "--out", str(out)]
    assert main(argv) == 0
    return out


def run_plan(
    workload: Path, varies: list[str], slo: str, replications: int | Replications, **more: object
) -> PlanResult:
    return plan(
        read_input(workload),
        [parse_vary(v) for v in varies],
        parse_slo(slo),
        replications=replications,
        **more,  # type: ignore[arg-type]
    )


def test_the_table_speaks_human_units_states_the_rule_and_what_would_settle_it(
    tmp_path: Path,
) -> None:
    workload = generated(tmp_path)
    result = run_plan(
        workload, ["providers.claude.concurrency=1..3"], "p95_wait<=10m", replications=3
    )
    table = plan_table(result)
    lines = table.splitlines()
    # Waits read as 4m12s or 1h03m, never as raw seconds past a minute.
    assert not re.search(r"\b\d{3,}(\.\d)?s\b", table), table
    assert re.search(r"\d+m\d\ds|\d+h\d\dm", lines[1]), lines[1]
    assert (
        "meets SLO: yes when the whole interval meets p95_wait<=10m"
        " (p95_wait mean + half <= 10m00s)" in table
    )
    undecided = [row for row in result.rows if row.verdict == "undecided"]
    assert undecided, table  # three days of a small team: too few to decide
    for row in undecided:
        label = " ".join(f"{k}={v}" for k, v in row.setting)
        assert row.settle is not None
        assert row.settle > 3
        assert f"undecided after 3: {label}: about {row.settle} replications" in table
        assert row.estimates["p95_wait"].low < 600 < row.estimates["p95_wait"].high
    for line, row in zip(lines[1:4], result.rows, strict=True):
        assert line.split()[-1] == {"meets": "yes", "misses": "no"}.get(row.verdict, row.verdict)


def test_auto_replications_decide_the_readme_question(tmp_path: Path) -> None:
    workload = generated(tmp_path)
    varies = ["providers.claude.concurrency=1..3"]
    fixed = run_plan(workload, varies, "p95_wait<=10m", replications=3)
    assert any(row.verdict == "undecided" for row in fixed.rows)
    auto = Replications.automatic()
    result = run_plan(workload, varies, "p95_wait<=10m", replications=auto)
    assert result.answer is not None
    for row in result.rows:
        assert row.replications in auto.looks
        p95 = row.estimates["p95_wait"]
        assert len(p95.values) == row.replications
        assert p95.confidence == auto.confidence
        if row.verdict == "meets":
            assert p95.high <= 600
        elif row.verdict == "misses":
            assert p95.low > 600
        else:
            assert row.replications == auto.cap
        # Stopped at the first look that decided: the look before did not.
        if row.verdict != "undecided" and row.replications > auto.looks[0]:
            before = auto.looks[auto.looks.index(row.replications) - 1]
            earlier = run_plan(
                workload, [f"providers.claude.concurrency={row.setting[0][1]}"],
                "p95_wait<=10m", replications=before,
            )  # fmt: skip
            assert earlier.rows[0].estimates["p95_wait"].values == p95.values[:before]


def test_the_cheapest_configuration_meeting_the_slo_and_its_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generated(tmp_path)
    # Sweep order puts 3 slots first: the smallest-in-order answer would be 3.
    argv = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=3,2,1"]
    argv += ["--vary", "providers.claude.accounts=2,1", "--slo", "p95_wait<=10h"]
    argv += ["--replications", "2", "--workers", "1"]
    argv += ["--cost", "providers.claude.concurrency=40", "--cost", "providers.claude.accounts=150"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[-3:] == ["cost/month", "meets", "SLO"]
    assert out.splitlines()[-1] == (
        "cheapest configuration meeting p95_wait<=10h:"
        " providers.claude.concurrency=1 providers.claude.accounts=1, 190 a month"
    )
    assert main([*argv, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["smallest"] == {"providers.claude.concurrency": 3, "providers.claude.accounts": 2}
    assert answer["cheapest"] == {
        "settings": {"providers.claude.concurrency": 1, "providers.claude.accounts": 1},
        "cost": 190.0,
    }
    assert [c["cost"] for c in answer["configurations"]] == [420, 270, 380, 230, 340, 190]


NOT_A_NUMBER = (
    "--cost providers.claude.exec: --vary providers.claude.concurrency=1 sets"
    " providers.claude.exec to ['claude', '-p'], not a number"
)
NO_VALUE = (
    "--cost providers.nobody.concurrency: --vary providers.claude.concurrency=1 has no value"
    " for providers.nobody.concurrency"
)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("providers.claude.concurrency", "--cost providers.claude.concurrency: expected KEY=PRICE"),
        ("providers.claude.concurrency=cheap", "expected a price >= 0 such as 40 or 12.5"),
        ("providers.claude.concurrency=-1", "expected a price >= 0"),
        ("providers.claude.exec=1", NOT_A_NUMBER),
        ("providers.nobody.concurrency=1", NO_VALUE),
    ],
)
def test_a_bad_cost_is_one_line_and_exit_2_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    workload = generated(tmp_path)
    capsys.readouterr()
    argv = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1"]
    assert main([*argv, "--slo", "p95_wait<=1m", "--cost", flag]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("herdsman: --cost ")
    assert len(err.splitlines()) == 1


def test_auto_and_costs_are_the_same_for_any_number_of_workers(tmp_path: Path) -> None:
    workload = generated(tmp_path)
    args = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1..2"]
    args += ["--vary", "providers.claude.accounts=1,2", "--slo", "p95_wait<=10m"]
    args += ["--replications", "auto:20", "--cost", "providers.claude.accounts=100", "--json"]
    one = herdsman(*args, "--workers", "1", cwd=tmp_path, hash_seed="1")
    two = herdsman(*args, "--workers", "2", cwd=tmp_path, hash_seed="2")
    assert one.returncode in (0, 1), one.stderr
    assert (two.returncode, two.stdout) == (one.returncode, one.stdout)
    assert json.loads(one.stdout)["looks"] == [5, 10, 20]


def marks(figure: Figure) -> dict[str, str]:
    """Each configuration's verdict as drawn: its marker's gid is 'label|verdict'."""
    (axes,) = figure.axes
    gids = [line.get_gid() or "" for line in axes.lines]
    return dict(gid.split("|", 1) for gid in gids if "|" in gid)


def xdata(line: Line2D | None) -> list[float]:
    assert line is not None
    return [float(x) for x in np.asarray(line.get_xdata(), dtype=float)]


def ydata(line: Line2D | None) -> list[float]:
    assert line is not None
    return [float(y) for y in np.asarray(line.get_ydata(), dtype=float)]


def bars(axes: object) -> list[ErrorbarContainer]:
    """The error-bar series drawn, in drawing order."""
    return [c for c in axes.containers if isinstance(c, ErrorbarContainer)]  # type: ignore[attr-defined]


def test_the_plot_reads_at_a_glance_with_one_varied_key(tmp_path: Path) -> None:
    workload = generated(tmp_path)
    result = run_plan(
        workload, ["providers.claude.concurrency=1..4"], "p95_wait<=10m", replications=3
    )
    figure = plan_figure(result)
    (axes,) = figure.axes
    # Whole-number ticks for a whole-number key, exactly its values.
    assert list(axes.get_xticks()) == [1, 2, 3, 4]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["1", "2", "3", "4"]
    # Waits in minutes (the unit of the SLO's 10 minutes), from zero up.
    assert axes.get_ylabel() == "p95_wait (min)"
    assert axes.get_ylim()[0] == 0
    # Each configuration marked exactly as the table says.
    assert marks(figure) == {
        " ".join(f"{k}={v}" for k, v in row.setting): row.verdict for row in result.rows
    }
    # The SLO line at 10 minutes, and no interval bar below zero.
    slo = [line for line in axes.lines if line.get_label() == "SLO p95_wait<=10m"]
    assert [ydata(line) for line in slo] == [[10, 10]]
    for collection in axes.collections:
        assert isinstance(collection, LineCollection)
        for segment in collection.get_segments():
            assert min(y for _, y in segment) >= 0
    # p95 is not hidden under p99: drawn beside it, at other x positions.
    legend_box = axes.get_legend()
    assert legend_box is not None
    legend = [text.get_text() for text in legend_box.get_texts()]
    assert {"p50", "p95", "p99", "SLO p95_wait<=10m"} <= set(legend)
    drawn = {
        c.get_label(): xdata(c.lines[0]) for c in bars(axes) if c.get_label() in ("p95", "p99")
    }
    assert all(a != b for a, b in zip(drawn["p95"], drawn["p99"], strict=True))


def test_the_plot_draws_one_line_per_value_of_the_second_key(tmp_path: Path) -> None:
    workload = generated(tmp_path, span="8h", rate="4")
    result = run_plan(
        workload,
        ["providers.claude.concurrency=1..3", "providers.claude.accounts=1,2"],
        "p95_wait<=30m",
        replications=3,
    )
    figure = plan_figure(result)
    (axes,) = figure.axes
    containers = bars(axes)
    assert [c.get_label() for c in containers] == ["1", "2"]
    legend = axes.get_legend()
    assert legend is not None
    assert legend.get_title().get_text() == "providers.claude.accounts"
    # Waits in minutes: the SLO's 30 minutes reads as 30, whatever the largest wait.
    assert axes.get_ylabel() == "p95_wait (min)"
    scale = 60
    for container, accounts in zip(containers, ("1", "2"), strict=True):
        mine = [row for row in result.rows if row.setting[1][1] == accounts]
        line = container.lines[0]
        xs = xdata(line)
        assert sorted(xs) == xs
        assert len(xs) == 3
        assert ydata(line) == pytest.approx(
            [row.estimates["p95_wait"].mean / scale for row in mine]
        )
    assert [t.get_text() for t in axes.get_xticklabels()] == ["1", "2", "3"]
    assert len(marks(figure)) == 6
    assert marks(figure) == {
        " ".join(f"{k}={v}" for k, v in row.setting): row.verdict for row in result.rows
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "many",
            "--replications: expected a whole number from 1 to 10000, auto or auto:CAP, got 'many'",
        ),
        ("auto:3", "--replications auto:CAP: expected a whole number from 5 to 10000, got '3'"),
        ("auto:", "--replications auto:CAP: expected a whole number from 5 to 10000, got ''"),
    ],
)
def test_a_bad_replications_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    workload = generated(tmp_path)
    capsys.readouterr()
    argv = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1"]
    assert main([*argv, "--slo", "p95_wait<=1m", "--replications", value]) == 2
    assert capsys.readouterr().err == f"herdsman: {message}\n"


class Terminal(io.StringIO):
    """Standard error as a terminal: where the progress bar shows."""

    def isatty(self) -> bool:
        return True


def test_with_auto_the_progress_bar_grows_to_what_was_simulated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generated(tmp_path)
    argv = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1..2"]
    argv += ["--slo", "p95_wait<=10m", "--replications", "auto:20", "--workers", "1", "--json"]
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    main(argv)
    done = sum(c["replications"] for c in json.loads(capsys.readouterr().out)["configurations"])
    assert done > 10  # some configuration needed more than the first look
    assert f"simulating: 100%|##########| {done}/{done}" in terminal.getvalue()
