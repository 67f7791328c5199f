"""``herdsman sim plan``: replications, the SLO answer, workers, JSON, plot and errors."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from sim_workloads import CONFIG, busy_trace, herdsman

from herdsman.cli import main
from herdsman.config import LoadedConfig, load_config_text
from herdsman.sim.metrics import Metrics
from herdsman.sim.model import ModelError
from herdsman.sim.plan import plan, read_input, replication, trio_engine
from herdsman.sim.slo import parse_slo
from herdsman.sim.stats import estimate
from herdsman.sim.sweep import parse_vary
from herdsman.sim.workload import Workload


def generated(tmp_path: Path, *more: str) -> Path:
    (tmp_path / "supervisor.toml").write_text(CONFIG)
    out = tmp_path / "workload.jsonl"
    argv = ["sim", "generate", "-c", str(tmp_path / "supervisor.toml"), "--span", "40m"]
    argv += ["--arrivals", "poisson:30", "--durations", "exponential:3m", "--turns", "1.5"]
    argv += ["--providers", "claude=3,codex=1", "--seed", "5", "--out", str(out), *more]
    assert main(argv) == 0
    return out


def test_workers_do_not_change_the_result(tmp_path: Path) -> None:
    workload = generated(tmp_path)
    args = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1,3"]
    args += ["--vary", "providers.claude.accounts=1..2", "--slo", "p95_wait<=1h"]
    args += ["--replications", "2", "--seed", "2", "--json"]
    one = herdsman(*args, "--workers", "1", cwd=tmp_path, hash_seed="1")
    two = herdsman(*args, "--workers", "2", cwd=tmp_path, hash_seed="2")
    assert one.returncode in (0, 1), one.stderr
    assert (two.returncode, two.stdout) == (one.returncode, one.stdout)
    result = json.loads(one.stdout)
    assert [c["settings"] for c in result["configurations"]] == [
        {"providers.claude.concurrency": c, "providers.claude.accounts": a}
        for c in (1, 3)
        for a in (1, 2)
    ]
    for configuration in result["configurations"]:
        for figures in configuration["metrics"].values():
            assert len(figures["values"]) == 2
            again = estimate(figures["values"])
            assert figures["ci"] == [again.low, again.high]
            assert figures["mean"] == again.mean


def test_the_smallest_configuration_meeting_the_slo_and_the_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generated(tmp_path)
    base = ["sim", "plan", str(workload), "--vary", "supervisor.max_concurrency=1..3"]
    base += ["--replications", "2", "--workers", "1", "--json"]
    assert main([*base, "--slo", "p95_wait<=0"]) in (0, 1)
    everything = json.loads(capsys.readouterr().out)
    # p95 is the SLO: derive the answer from the table itself.
    meeting = [
        c["settings"]
        for c in everything["configurations"]
        if c["metrics"]["p95_wait"]["ci"][1] <= 120
    ]
    code = main([*base, "--slo", "p95_wait<=2m"])
    answer = json.loads(capsys.readouterr().out)
    assert answer["smallest"] == (meeting[0] if meeting else None)
    assert code == (0 if meeting else 1)
    # With one slot the queue is long; with three it is shorter: the sweep sees it.
    waits = [c["metrics"]["mean_wait"]["mean"] for c in everything["configurations"]]
    assert waits[0] > waits[-1]
    # An SLO nothing can meet exits 1 and says so.
    one = ["sim", "plan", str(workload), "--vary", "supervisor.max_concurrency=1"]
    assert main([*one, "--replications", "1", "--slo", "utilisation>=100%"]) == 1
    assert "no configuration meets utilisation>=100%" in capsys.readouterr().out


def test_replications_of_a_generated_workload_are_fresh_draws_of_its_model(
    tmp_path: Path,
) -> None:
    source = read_input(generated(tmp_path))
    assert source.kind == "generated"
    first, second, third = (replication(source, n, 0) for n in range(3))
    assert first is source.workload
    assert len({len(w.plans) for w in (first, second, third)} | {0}) > 2
    assert replication(source, 2, 0) == third  # seeded: the same draw again
    assert replication(source, 2, 1) != third  # another --seed, another draw


def test_replications_of_a_recorded_trace_redraw_durations_only(tmp_path: Path) -> None:
    source = read_input(busy_trace(tmp_path / "busy.jsonl", runs=40))
    assert source.kind == "recorded"
    again = replication(source, 1, 0)
    assert again.arrivals == source.workload.arrivals
    before = {run: [a.outcome for a in p.attempts] for run, p in source.workload.plans.items()}
    after = {run: [a.outcome for a in p.attempts] for run, p in again.plans.items()}
    assert before == after
    pool = {a.duration for p in source.workload.plans.values() for a in p.attempts}
    drawn = [a.duration for p in again.plans.values() for a in p.attempts]
    assert set(drawn) <= pool
    assert drawn != [a.duration for p in source.workload.plans.values() for a in p.attempts]


def test_a_recorded_trace_without_durations_has_one_replication_only(tmp_path: Path) -> None:
    trace = tmp_path / "queued.jsonl"
    lines = busy_trace(tmp_path / "busy.jsonl", runs=3).read_text().splitlines()
    # Submits only, no duration: nothing to redraw from.
    kept = [lines[0]] + [
        json.dumps({k: v for k, v in json.loads(line).items() if k not in ("duration", "outcome")})
        for line in lines[1:]
        if '"submit"' in line
    ]
    trace.write_text("\n".join(kept) + "\n")
    source = read_input(trace)
    assert replication(source, 0, 0) is source.workload
    with pytest.raises(ModelError) as info:
        replication(source, 1, 0)
    assert str(info.value).startswith(f"{trace}: a replication of a recorded trace redraws")
    assert str(info.value).endswith("use --replications 1")


def test_the_engine_is_a_parameter(tmp_path: Path) -> None:
    source = read_input(generated(tmp_path))
    seen: list[int] = []

    def counting(workload: Workload, loaded: LoadedConfig) -> Metrics:
        seen.append(loaded.config.providers["claude"].concurrency)
        return trio_engine(workload, loaded)

    vary = parse_vary("providers.claude.concurrency=1,2")
    result = plan(source, [vary], parse_slo("p95_wait<=1h"), replications=2, engine=counting)
    # Replication by replication: each is built once for every configuration.
    assert seen == [1, 2, 1, 2]
    assert len(result.rows) == 2


def test_the_table_and_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = generated(tmp_path)
    picture = tmp_path / "waits.png"
    argv = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1..2"]
    argv += ["--slo", "p95_wait<=10h", "--replications", "2", "--workers", "1"]
    assert main([*argv, "--plot", str(picture)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["providers.claude.concurrency", "p50", "wait"]
    assert [line.split()[0] for line in out[1:3]] == ["1", "2"]
    assert out[-1] == "smallest configuration meeting p95_wait<=10h: providers.claude.concurrency=1"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_plot_names_the_extra_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real = importlib.util.find_spec

    def hidden(name: str, *args: Any) -> Any:
        return None if name == "matplotlib" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", hidden)
    argv = [
        "sim",
        "plan",
        str(tmp_path / "never-read.jsonl"),
        "--vary",
        "supervisor.max_concurrency=1",
    ]
    assert main([*argv, "--slo", "p95_wait<=1m", "--plot", str(tmp_path / "w.png")]) == 2
    assert capsys.readouterr().err == (
        "herdsman: --plot needs matplotlib, which is not installed: pip install 'herdsman[plot]'\n"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--replications", "0"], "--replications: expected a whole number from 1 to 10000"),
        (["--workers", "-2"], "--workers: expected a whole number from 1 to 1024, got '-2'"),
        (["--slo", "p95_wait<=fast"], "--slo: p95_wait<=fast: expected a wait such as"),
        (["--slo", "p95_wait<="], "--slo: p95_wait<=: no threshold after <=; write one, e.g."
                                  " p95_wait<=10m\n"),
        (["--slo", "utilisation>"], "--slo: utilisation>: no threshold after >; write one, e.g."
                                    " utilisation>80%\n"),
        (["--vary", "providers.claude.concurrency=0"], "--vary providers.claude.concurrency=0:"),
        (["--plot", "/no/such/dir/w.png"], "--plot /no/such/dir/w.png: no such directory"),
    ],
)  # fmt: skip
def test_a_bad_flag_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    workload = generated(tmp_path)
    capsys.readouterr()
    args = {"--slo": "p95_wait<=1m", "--vary": "supervisor.max_concurrency=1"}
    args.update(dict(zip(flags[::2], flags[1::2], strict=True)))
    argv = ["sim", "plan", str(workload), *(part for pair in args.items() for part in pair)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"herdsman: {message}"), err
    assert len(err.splitlines()) == 1


def test_a_plot_in_a_format_matplotlib_cannot_write_is_refused_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "plan", str(tmp_path / "never-read.jsonl")]
    argv += ["--vary", "supervisor.max_concurrency=1", "--slo", "p95_wait<=1m"]
    assert main([*argv, "--plot", str(tmp_path / "waits.txt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"herdsman: --plot {tmp_path / 'waits.txt'}: cannot draw a .txt file; name a .png (or one"
    ), err
    assert ".svg" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "waits.txt").exists()


def test_a_key_priced_twice_is_refused_before_reading_the_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sim", "plan", str(tmp_path / "never-read.jsonl")]
    argv += ["--vary", "providers.claude.concurrency=1,2", "--slo", "p95_wait<=1m"]
    argv += [
        "--cost",
        "providers.claude.concurrency=40",
        "--cost",
        "providers.claude.concurrency=10",
    ]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "herdsman: --cost providers.claude.concurrency: priced twice, at 40 and 10;"
        " give each key one price\n"
    )


def test_several_slo_flags_are_one_slo_every_clause_of_which_must_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generated(tmp_path)
    capsys.readouterr()
    argv = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1..2"]
    argv += ["--replications", "2", "--workers", "1"]
    assert main([*argv, "--slo", "p95_wait<=10h"]) == 0
    capsys.readouterr()
    # Neither flag is dropped: the unmeetable first clause still decides.
    assert main([*argv, "--slo", "p99_wait<=0", "--slo", "p95_wait<=10h"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "no configuration meets p99_wait<=0,p95_wait<=10h"


class Terminal(io.StringIO):
    """Standard error as a terminal: where the progress bar shows."""

    def isatty(self) -> bool:
        return True


def test_a_progress_bar_counts_simulations_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = generated(tmp_path)
    argv = ["sim", "plan", str(workload), "--vary", "providers.claude.concurrency=1..2"]
    argv += ["--slo", "p95_wait<=10h", "--replications", "2", "--workers", "1"]
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    assert "simulating: 100%" in terminal.getvalue()
    assert "4/4" in terminal.getvalue()
    # Not on a terminal (a pipe, CI): no bar.
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stderr", piped)
    assert main(argv) == 0
    assert "simulating" not in piped.getvalue()


def test_a_recorded_shutdown_is_left_out_of_a_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A drain stops starts; a plan asks how a configuration serves every run, so it serves them."""
    trace = busy_trace(tmp_path / "busy.jsonl", runs=40)
    lines = trace.read_text().splitlines()
    last = json.loads(lines[-1])
    drain = {"t": last["t"], "seq": last["seq"] + 1, "event": "shutdown", "forced": False}
    trace.write_text("\n".join([*lines, json.dumps(drain)]) + "\n")
    source = read_input(trace)
    # Replayed as recorded, the drain leaves the one slot's queue unstarted...
    one_slot = CONFIG.replace("concurrency = 3", "concurrency = 1")
    loaded = load_config_text(one_slot, Path("/sim/supervisor.toml"), environ={})
    assert trio_engine(source.workload, loaded).unstarted > 0
    # ... but planned, every run is served and waits for its slot.
    args = ["sim", "plan", str(trace), "--vary", "providers.claude.concurrency=1"]
    args += ["--vary", "providers.codex.concurrency=1", "--replications", "1", "--json"]
    assert main([*args, "--slo", "p95_wait<=0"]) in (0, 1)
    (configuration,) = json.loads(capsys.readouterr().out)["configurations"]
    assert configuration["metrics"]["unstarted"]["mean"] == 0
    assert configuration["metrics"]["p99_wait"]["mean"] > 0
