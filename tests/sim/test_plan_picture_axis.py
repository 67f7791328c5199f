"""``sim plan --plot``: a series at zero is drawn over the x axis, not hidden under it."""

from __future__ import annotations

from pathlib import Path

from matplotlib.container import ErrorbarContainer
from sim_workloads import CONFIG

from herdsman.cli import main
from herdsman.sim.plan import plan, read_input
from herdsman.sim.plan_report import plan_figure
from herdsman.sim.slo import parse_slo
from herdsman.sim.sweep import parse_vary


def test_a_p50_of_zero_is_drawn_over_the_x_axis(tmp_path: Path) -> None:
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    workload = tmp_path / "workload.jsonl"
    argv = ["sim", "generate", "-c", str(tmp_path / "supervisor.toml"), "--span", "1h"]
    argv += ["--arrivals", "poisson:4", "--durations", "exponential:5m"]
    argv += ["--providers", "claude=1", "--seed", "3", "--out", str(workload)]
    assert main(argv) == 0
    result = plan(
        read_input(workload),
        [parse_vary("providers.claude.concurrency=2..3")],
        parse_slo("p95_wait<=10m"),
        replications=2,
    )
    # The case in point: with slots to spare, half the runs never wait.
    assert all(row.estimates["p50_wait"].high == 0 for row in result.rows)
    (axes,) = plan_figure(result).axes
    frame = max(spine.get_zorder() for spine in axes.spines.values())
    series = [c for c in axes.containers if isinstance(c, ErrorbarContainer)]
    assert [c.get_label() for c in series] == ["p50", "p95", "p99"]
    for container in series:
        line = container.lines[0]
        assert line is not None
        assert line.get_zorder() > frame, container.get_label()
        assert not line.get_clip_on(), container.get_label()
