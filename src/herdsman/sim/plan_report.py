"""A plan's result as a table, as JSON, and as a picture (matplotlib, optional)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from herdsman.config.overrides import parse_value_text
from herdsman.sim.metrics import METRICS
from herdsman.sim.plan import PlanInput, PlanResult, Row
from herdsman.sim.stats import Estimate

__all__ = ["PlotError", "check_plot", "plan_json", "plan_table", "plot_waits"]

#: Metrics the table shows, and their column titles.
_COLUMNS = {
    "p50_wait": "p50 wait",
    "p95_wait": "p95 wait",
    "p99_wait": "p99 wait",
    "utilisation": "utilisation",
    "throughput": "runs/h",
    "usage_limited": "usage limits",
    "timeouts": "timeouts",
    "unstarted": "never started",
}


class PlotError(Exception):
    """``--plot`` cannot draw (matplotlib is missing)."""


def _shown(name: str, value: float) -> str:
    if name.endswith("_wait"):
        # Tenths matter for short waits only; long ones read better whole.
        return f"{value:.1f}s" if value < 100 else f"{value:.0f}s"
    if name == "utilisation":
        return f"{value * 100:.0f}%"
    return f"{value:.1f}"


def _cell(name: str, estimate: Estimate) -> str:
    text = _shown(name, estimate.mean)
    if estimate.high > estimate.low:
        half = (estimate.high - estimate.low) / 2
        spread = f"{half * 100:.0f}" if name == "utilisation" else _shown(name, half)
        text += f" ±{spread}"
    return text


def plan_table(result: PlanResult) -> str:
    """The human-readable table, one configuration per line, and the answer."""
    keys = [key for key, _ in result.rows[0].setting]
    # "never started" only when some configuration left runs unstarted.
    columns = [
        name
        for name in _COLUMNS
        if name != "unstarted" or any(r.estimates[name].high > 0 for r in result.rows)
    ]
    head = [*keys, *(_COLUMNS[name] for name in columns), "meets SLO"]
    body = [
        [
            *(value for _, value in row.setting),
            *(_cell(name, row.estimates[name]) for name in columns),
            "yes" if row.meets else "no",
        ]
        for row in result.rows
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
             for line in [head, *body]]  # fmt: skip
    ci = "mean ± half the 95% confidence interval" if result.replications > 1 else "one replication"
    lines.append(
        f"{result.replications} replication(s) of a {result.kind} workload per configuration"
        f" ({ci}); seed {result.seed}"
    )
    if result.smallest is None:
        lines.append(f"no configuration meets {result.slo.text}")
    else:
        lines.append(f"smallest configuration meeting {result.slo.text}: {_label(result.smallest)}")
    return "\n".join(lines) + "\n"


def _label(row: Row) -> str:
    return " ".join(f"{key}={value}" for key, value in row.setting)


def plan_json(result: PlanResult, source: PlanInput) -> dict[str, Any]:
    """The result for machines (``--json``)."""
    return {
        "input": {"trace": str(source.path), "kind": result.kind},
        "replications": result.replications,
        "seed": result.seed,
        "slo": result.slo.text,
        "vary": [key for key, _ in result.rows[0].setting],
        "configurations": [
            {
                "settings": _values(row),
                "meets_slo": row.meets,
                "metrics": {
                    name: {
                        "mean": row.estimates[name].mean,
                        "ci95": [row.estimates[name].low, row.estimates[name].high],
                        "values": list(row.estimates[name].values),
                    }
                    for name in METRICS
                },
            }
            for row in result.rows
        ],
        "smallest": None if result.smallest is None else _values(result.smallest),
    }


def _values(row: Row) -> dict[str, Any]:
    # As --set reads them: 2 is a number, 5m a string.
    return {key: parse_value_text(value) for key, value in row.setting}


def check_plot(path: Path) -> None:
    """Fail before a long sweep, not after it, if ``--plot`` cannot be drawn."""
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotError(
            "--plot needs matplotlib, which is not installed: pip install 'herdsman[plot]'"
        )
    if not path.parent.is_dir():
        raise PlotError(f"--plot {path}: no such directory {path.parent}")


def plot_waits(result: PlanResult, path: Path) -> None:
    """Draw p50/p95/p99 wait (with their intervals) against the configurations."""
    check_plot(path)
    import matplotlib  # noqa: PLC0415 - an optional extra

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt  # noqa: PLC0415

    keys = [key for key, _ in result.rows[0].setting]
    labels = [" ".join(value for _, value in row.setting) for row in result.rows]
    numeric = len(keys) == 1 and all(_is_number(label) for label in labels)
    xs = [float(label) for label in labels] if numeric else list(range(len(labels)))
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for name in ("p50_wait", "p95_wait", "p99_wait"):
        estimates = [row.estimates[name] for row in result.rows]
        means = [e.mean for e in estimates]
        errors = [[e.mean - e.low for e in estimates], [e.high - e.mean for e in estimates]]
        axes.errorbar(xs, means, yerr=errors, marker="o", capsize=3, label=name)
    for clause in result.slo.clauses:
        if clause.metric.endswith("_wait"):
            axes.axhline(clause.value, linestyle="--", color="grey", label=f"SLO {clause.text}")
    if not numeric:
        axes.set_xticks(xs, labels, rotation=30, ha="right")
    axes.set_xlabel(" / ".join(keys))
    axes.set_ylabel("queue wait (s)")
    axes.set_title(f"queue wait, {result.replications} replication(s) per configuration")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
