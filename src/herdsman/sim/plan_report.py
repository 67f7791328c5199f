"""A plan's result as a table, as JSON, and as a picture (matplotlib, optional)."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from herdsman.cli_tables import duration_text
from herdsman.config.overrides import parse_value_text
from herdsman.sim.metrics import METRICS, SPEND_METRICS
from herdsman.sim.plan import PlanInput, PlanResult, Row
from herdsman.sim.slo import Clause
from herdsman.sim.stats import Estimate
from herdsman.spend_text import tokens_short

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "PlotError",
    "check_plot",
    "metric_text",
    "plan_figure",
    "plan_json",
    "plan_table",
    "plot_waits",
]

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
    "spend_per_day": "spend/day",
    "tokens_per_day": "tokens/day",
    "spend_per_run": "spend/run",
    "tokens_per_run": "tokens/run",
}

#: The table's word for each verdict.
_VERDICT_TEXT = {"meets": "yes", "misses": "no", "undecided": "undecided"}


class PlotError(Exception):
    """``--plot`` cannot draw (matplotlib is missing)."""


def metric_text(name: str, value: float) -> str:
    """A metric's value in its own unit: ``4m12s``, ``1h03m``, ``36%``, ``18.4``,
    ``3.1M`` (tokens), ``$12.40`` (spend)."""
    if name.endswith("_wait"):
        return duration_text(value)
    if name == "utilisation":
        return f"{value * 100:.0f}%"
    if name.startswith("tokens_"):
        return tokens_short(round(value))
    if name.startswith("spend_"):
        return f"${value:,.2f}" if value >= 1 or value == 0 else f"${value:.4f}"
    return f"{value:.1f}"


def _cell(name: str, estimate: Estimate) -> str:
    text = metric_text(name, estimate.mean)
    if estimate.high > estimate.low:
        half = (estimate.high - estimate.low) / 2
        spread = f"{half * 100:.0f}" if name == "utilisation" else metric_text(name, half)
        text += f" ±{spread}"
    return text


def _money(value: float) -> str:
    return f"{value:,.2f}".removesuffix(".00")


def _threshold(clause: Clause) -> str:
    if clause.metric.endswith("_wait"):
        return duration_text(clause.value)
    if clause.metric == "utilisation":
        return f"{clause.value * 100:g}%"
    if clause.metric.startswith(("tokens_", "spend_")):
        return metric_text(clause.metric, clause.value)
    return f"{clause.value:g}"


def plan_table(result: PlanResult) -> str:
    """The human-readable table, one configuration per line, the rule and the answer."""
    keys = [key for key, _ in result.rows[0].setting]
    # "never started" only when some configuration left runs unstarted.
    # Spend only for a workload with a spend model: a table without it is as it was.
    spent = result.spent
    columns = [
        name
        for name in _COLUMNS
        if (name != "unstarted" or any(r.estimates[name].high > 0 for r in result.rows))
        and (name not in SPEND_METRICS or name in spent)
    ]
    auto = result.replications.auto
    head = [
        *keys,
        *(_COLUMNS[name] for name in columns),
        *(["replications"] if auto else []),
        *(["cost/month"] if result.priced else []),
        "meets SLO",
    ]
    body = [
        [
            *(value for _, value in row.setting),
            *(_cell(name, row.estimates[name]) for name in columns),
            *([str(row.replications)] if auto else []),
            *([_money(row.cost or 0.0)] if result.priced else []),
            _VERDICT_TEXT[row.verdict],
        ]
        for row in result.rows
    ]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
             for line in [head, *body]]  # fmt: skip
    lines += _notes(result)
    return "\n".join(lines) + "\n"


def _notes(result: PlanResult) -> list[str]:
    """What is under the table: how it was measured, the rule for "meets", the answer."""
    spec = result.replications
    percent = f"{spec.confidence * 100:.3g}%"
    if spec.auto:
        looks = ", ".join(str(n) for n in spec.looks)
        lines = [
            f"replications: auto, a {result.kind} workload simulated {looks} times until each"
            f" configuration's interval decides the SLO; mean ± half the {percent} confidence"
            f" interval (95% split over {len(spec.looks)} looks); seed {result.seed}"
        ]
    elif spec.cap > 1:
        lines = [
            f"{spec.cap} replications of a {result.kind} workload per configuration"
            f" (mean ± half the {percent} confidence interval); seed {result.seed}"
        ]
    else:
        lines = [
            f"1 replication of a {result.kind} workload per configuration (no interval);"
            f" seed {result.seed}"
        ]
    rules = "; ".join(
        f"{clause.metric} {'mean + half' if clause.op in ('<=', '<') else 'mean - half'}"
        f" {clause.op} {_threshold(clause)}"
        for clause in result.slo.clauses
    )
    lines.append(
        f"meets SLO: yes when the whole interval meets {result.slo.text} ({rules}); no when the"
        " whole interval misses it; undecided when the interval straddles a threshold"
        " (not counted as meeting)"
    )
    for row in result.rows:
        if row.verdict != "undecided":
            continue
        if row.settle is None:
            likely = "no estimate of the replications that would settle it (no spread measured)"
        else:
            likely = f"about {row.settle} replications would likely settle it"
        after = f"after {row.replications}" + (
            " (the cap)" if spec.auto and row.replications == spec.cap else ""
        )
        lines.append(f"undecided {after}: {_label(row)}: {likely}")
    if any(row.verdict == "undecided" and row.settle is not None for row in result.rows):
        lines.append(
            "  (the interval's half-width is t·s/√n: the smallest n at which it falls under the"
            " distance from the mean to the threshold, if the mean and the spread s stay as"
            " measured)"
        )
    if result.spent:
        lines.append(
            "spend: what the agents burn (tokens; US dollars where the workload prices them),"
            " per day (of the simulated time, at least one) and per run that ended"
            + ("; not cost/month, which is what --cost prices" if result.priced else "")
        )
    if result.answer is None:
        lines.append(f"no configuration meets {result.slo.text}")
    elif result.priced:
        lines.append(
            f"cheapest configuration meeting {result.slo.text}: {_label(result.answer)},"
            f" {_money(result.answer.cost or 0.0)} a month{_spending(result, result.answer)}"
        )
    else:
        lines.append(
            f"smallest configuration meeting {result.slo.text}: {_label(result.answer)}"
            + _spending(result, result.answer)
        )
    return lines


def _spending(result: PlanResult, row: Row) -> str:
    """What the answer's agents spend a day (``$12.40/day``, ``3.1M tokens/day``), if measured."""
    spent = result.spent
    figures = [
        f"{metric_text(name, row.estimates[name].mean)}{unit}"
        for name, unit in (("spend_per_day", "/day"), ("tokens_per_day", " tokens/day"))
        if name in spent
    ]
    return f"; its agents spend {' and '.join(figures)}" if figures else ""


def _label(row: Row) -> str:
    return " ".join(f"{key}={value}" for key, value in row.setting)


def plan_json(result: PlanResult, source: PlanInput) -> dict[str, Any]:
    """The result for machines (``--json``)."""
    spec = result.replications
    spent = result.spent
    return {
        "input": {"trace": str(source.path), "kind": result.kind},
        "replications": "auto" if spec.auto else spec.cap,
        "looks": list(spec.looks),
        "confidence": spec.confidence,
        "seed": result.seed,
        "slo": result.slo.text,
        "vary": [key for key, _ in result.rows[0].setting],
        "configurations": [
            {
                "settings": _values(row),
                "meets_slo": row.meets,
                "verdict": row.verdict,
                "replications": row.replications,
                "settle_replications": row.settle,
                "cost": row.cost,
                "metrics": {
                    name: {
                        "mean": row.estimates[name].mean,
                        "ci": [row.estimates[name].low, row.estimates[name].high],
                        "values": list(row.estimates[name].values),
                    }
                    for name in METRICS
                    # Spend only for a workload with a spend model (as the table).
                    if name not in SPEND_METRICS or name in spent
                },
            }
            for row in result.rows
        ],
        "smallest": None if result.smallest is None else _values(result.smallest),
        "cheapest": (
            None
            if not result.priced or result.answer is None
            else {"settings": _values(result.answer), "cost": result.answer.cost}
        ),
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
    from matplotlib.backend_bases import FigureCanvasBase  # noqa: PLC0415 - optional

    # matplotlib picks the format by the extension (a name without one is a
    # PNG); one it cannot write would only fail once every simulation is done.
    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.removeprefix(".").lower()
    if suffix and suffix not in formats:
        raise PlotError(
            f"--plot {path}: cannot draw a .{suffix} file; name a .png"
            f" (or one of .{', .'.join(sorted(formats))})"
        )


def plot_waits(result: PlanResult, path: Path) -> None:
    """Draw :func:`plan_figure` into ``path`` (a PNG)."""
    check_plot(path)
    figure = plan_figure(result)
    figure.savefig(path, dpi=80)


#: How each verdict is marked on the plot: marker, filled, legend text.
MARKS = {
    "meets": ("o", True, "meets SLO"),
    "misses": ("X", True, "misses SLO"),
    "undecided": ("o", False, "undecided"),
}


def plan_figure(result: PlanResult) -> Figure:
    """The SLO's metric against the first varied key, each configuration marked.

    One line per value of the other varied keys (one line in all when one
    key is varied, and then the other wait percentiles drawn thin beside
    it); intervals clipped at zero; the SLO's thresholds dashed; each point
    marked as the table's "meets SLO" column says (:data:`MARKS`). Points
    sharing an x are drawn side by side, so none hides another. For a
    workload with a spend model, a second panel under it draws what the
    agents spend: the metric of the SLO's first spend clause, else spend
    (or, unpriced, tokens) per day.
    """
    from matplotlib.figure import Figure  # noqa: PLC0415 - an optional extra

    metric = result.slo.metric
    spent = result.spent
    # A workload with a spend model: what the agents spend, in a panel of its
    # own under the SLO's metric (unless that is the SLO's metric already).
    below = None
    if spent and metric not in SPEND_METRICS:
        clauses = [c.metric for c in result.slo.clauses if c.metric in spent]
        below = next(iter([*clauses, *spent]))  # spend_per_day before tokens_per_day
    if below is None:
        figure = Figure(figsize=(8, 4.5))
        _draw(figure.subplots(), result, metric)
    else:
        figure = Figure(figsize=(8, 8))
        top, bottom = figure.subplots(2, 1, sharex=True)
        _draw(top, result, metric)
        _draw(bottom, result, below)
    figure.tight_layout()
    return figure


def _draw(axes: Axes, result: PlanResult, metric: str) -> None:
    """Draw ``metric`` per configuration on ``axes`` (see :func:`plan_figure`)."""
    from matplotlib.lines import Line2D  # noqa: PLC0415 - an optional extra

    keys = [key for key, _ in result.rows[0].setting]
    xs, ticks, tick_labels = _positions(result.rows)
    groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
    for index, row in enumerate(result.rows):
        groups.setdefault(row.setting[1:], []).append(index)
    scale, unit = _scale(metric, result)
    series: list[tuple[str, str, list[int], bool]] = []  # label, metric, rows, marked
    if len(keys) == 1 and metric.endswith("_wait"):
        everyone = list(range(len(result.rows)))
        for name in ("p50_wait", "p95_wait", "p99_wait"):
            series.append((name.removesuffix("_wait"), name, everyone, name == metric))
        if metric not in ("p50_wait", "p95_wait", "p99_wait"):
            series.append((metric, metric, everyone, True))
    else:
        for rest, members in groups.items():
            # One other key: its name is the legend's title, each line its value.
            label = rest[0][1] if len(rest) == 1 else ", ".join(f"{k}={v}" for k, v in rest)
            series.append((label or metric, metric, members, True))
    spacing = min((b - a for a, b in itertools.pairwise(ticks)), default=1.0)
    width = spacing * 0.16
    for number, (label, name, members, marked) in enumerate(series):
        offset = (number - (len(series) - 1) / 2) * width / max(len(series) - 1, 1)
        x = [xs[i] + offset for i in members]
        estimates = [result.rows[i].estimates[name] for i in members]
        means = [e.mean / scale for e in estimates]
        below = [(e.mean - max(e.low, 0.0)) / scale for e in estimates]
        above = [(e.high - e.mean) / scale for e in estimates]
        drawn = axes.errorbar(
            x,
            means,
            yerr=[below, above],
            capsize=3,
            label=label,
            linewidth=2 if marked else 1,
            alpha=1.0 if marked else 0.5,
            # Over the axes' frame (2.5), unclipped: a series at zero (a p50
            # of 0.0s) sits on the x axis and would be hidden under it.
            zorder=3.5 if marked else 3,
            clip_on=False,
        )
        if not marked:
            continue
        colour = drawn.lines[0].get_color()
        for i, at, mean in zip(members, x, means, strict=True):
            row = result.rows[i]
            marker, filled, _ = MARKS[row.verdict]
            axes.plot(
                [at],
                [mean],
                linestyle="none",
                marker=marker,
                markersize=8,
                markeredgecolor=colour,
                markerfacecolor=colour if filled else "white",
                gid=f"{_label(row)}|{row.verdict}",
                zorder=4,
                label="_nolegend_",
            )
    for clause in result.slo.clauses:
        if clause.metric == metric:
            axes.axhline(
                clause.value / scale,
                linestyle="--",
                color="grey",
                label=f"SLO {clause.text}",
                zorder=1,
            )
    if metric.endswith("_wait") or metric in ("utilisation", "timeouts", *SPEND_METRICS):
        axes.set_ylim(bottom=0)
    axes.set_xticks(ticks, tick_labels)
    axes.set_xlabel(keys[0])
    axes.set_ylabel(f"{metric} ({unit})" if unit else metric)
    spec = result.replications
    count = "auto replications" if spec.auto else f"{spec.cap} replication(s)"
    axes.set_title(f"{metric} per configuration, {count}, {spec.confidence * 100:.3g}% intervals")
    verdicts = [
        Line2D(
            [],
            [],
            linestyle="none",
            marker=marker,
            color="black",
            markerfacecolor="black" if filled else "white",
            label=text,
        )
        for verdict, (marker, filled, text) in MARKS.items()
        if any(row.verdict == verdict for row in result.rows)
    ]
    handles, _ = axes.get_legend_handles_labels()
    axes.legend(
        handles=[*handles, *verdicts],
        title=keys[1] if len(keys) == 2 else None,
        fontsize="small",
        loc="best",
    )


def _positions(rows: Sequence[Row]) -> tuple[list[float], list[float], list[str]]:
    """Each row's x, and the ticks: the first key's own values when numbers, else places."""
    values: list[str] = []
    for row in rows:
        if row.setting[0][1] not in values:
            values.append(row.setting[0][1])
    numbers = [parse_value_text(value) for value in values]
    if all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers):
        ticks = [float(n) for n in numbers]
        labels = [str(n) for n in numbers]  # 2 stays 2: whole numbers for whole-number keys
    else:
        ticks = [float(place) for place in range(len(values))]
        labels = values
    where = dict(zip(values, ticks, strict=True))
    return [where[row.setting[0][1]] for row in rows], ticks, labels


def _scale(metric: str, result: PlanResult) -> tuple[float, str]:
    """A divisor and unit that keep the metric's axis readable: waits in s, min or h."""
    if metric == "utilisation":
        return 0.01, "%"
    if metric.startswith("spend_"):
        return 1.0, "$/day" if metric == "spend_per_day" else "$/run"
    if metric.startswith("tokens_"):
        per = "/day" if metric == "tokens_per_day" else "/run"
        top = max([c.value for c in result.slo.clauses if c.metric == metric] or [0.0])
        top = max(top, *(row.estimates[metric].high for row in result.rows))
        if top >= 2_000_000:
            return 1e6, f"M tokens{per}"
        return (1e3, f"k tokens{per}") if top >= 2_000 else (1.0, f"tokens{per}")
    if not metric.endswith("_wait"):
        return 1.0, "runs/h" if metric == "throughput" else ""
    # The SLO's threshold sets the unit, so the line a reader compares with
    # reads in round numbers (15 min, not 0.25 h); without one, the largest value.
    thresholds = [c.value for c in result.slo.clauses if c.metric == metric]
    drawn = {metric, "p50_wait", "p95_wait", "p99_wait"}
    top = max(thresholds or [row.estimates[n].high for row in result.rows for n in drawn])
    if top >= 2 * 3600:
        return 3600.0, "h"
    if top >= 120:
        return 60.0, "min"
    return 1.0, "s"
