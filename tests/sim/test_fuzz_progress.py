"""What ``sim fuzz`` shows while it runs, what ``--json`` prints, and ``--workers``.

Progress is driven by a fake clock (no test waits for seconds to pass);
the command is run in a process of its own, whose standard error is no
terminal, and in this one with a planted bug for a finding.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from sim_workloads import herdsman

from herdsman.cli import main
from herdsman.runtime.supervisor import Supervisor
from herdsman.sim.fuzz.campaign import fuzz_seeds
from herdsman.sim.fuzz.harness import Verdict
from herdsman.sim.fuzz.progress import Progress
from herdsman.sim.fuzz.scenario import draw_scenario

pytestmark = pytest.mark.usefixtures("quiet_herdsman")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _verdict(seed: int) -> Verdict:
    return Verdict(draw_scenario(seed), (), (), 60.0, 0.5, faults=2)


def test_a_terminal_sees_the_slowest_running_seed_first() -> None:
    clock, out = _Clock(), io.StringIO()
    progress = Progress(out, 10, tty=True, clock=clock, columns=200)
    progress.started(draw_scenario(5002))  # 24 runs, git 40 s a call
    clock.now += 1
    progress.started(draw_scenario(5003))
    progress.finished(_verdict(5003))
    clock.now += 12
    progress.tick()
    line = out.getvalue().split("\r")[-1].rstrip()
    assert line.startswith("1/10 seeds 0.1/s, ")
    assert f", {draw_scenario(5003).run_count} runs, 2 faults | seed 5002 13s: 24 runs, " in line
    assert line.endswith(", git 40s")
    assert "\n" not in out.getvalue()  # rewritten in place, never a new line


def test_a_seed_whose_run_ended_is_no_longer_shown_running() -> None:
    # With workers, a seed may end before the seeds ahead of it are counted.
    clock, out = _Clock(), io.StringIO()
    progress = Progress(out, 10, tty=True, clock=clock, columns=200)
    progress.started(draw_scenario(5002))
    progress.started(draw_scenario(5003))
    progress.ended(5003)
    progress.tick()
    line = out.getvalue().split("\r")[-1]
    assert "seed 5002 " in line
    assert "seed 5003" not in line
    assert line.startswith("0/10 seeds")


def test_a_terminal_line_never_wraps() -> None:
    clock, out = _Clock(), io.StringIO()
    progress = Progress(out, 2000, tty=True, clock=clock, columns=40)
    progress.started(draw_scenario(5002))
    progress.started(draw_scenario(5003))
    progress.tick()
    assert len(out.getvalue().split("\r")[-1]) == 39


def test_plain_lines_name_a_slow_seed_once_and_sum_up_every_so_often() -> None:
    clock, out = _Clock(), io.StringIO()
    progress = Progress(out, 300, tty=False, clock=clock, every=10.0, slow=10.0)
    progress.started(draw_scenario(5002))
    clock.now += 4
    progress.tick()
    assert out.getvalue() == ""
    clock.now += 7
    progress.tick()
    progress.tick()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("seed 5002: still running after 11s (24 runs, ")
    assert lines[1] == "0/300 seeds, 0 runs, 0 faults, 0.00 seeds/s"
    assert len(lines) == 2
    progress.finished(_verdict(5002))
    clock.now += 10
    progress.tick()
    assert out.getvalue().splitlines()[-1] == "1/300 seeds, 24 runs, 2 faults, 0.05 seeds/s"


def test_the_command_draws_its_line_on_a_terminal_and_clears_it(tmp_path: Path) -> None:
    ours, theirs = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "herdsman", "sim", "fuzz", "--seeds", "1", "--seed", "5002"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=theirs,
        text=True,
    ) as done:
        os.close(theirs)
        out, _ = done.communicate(timeout=600)
    seen = b""
    while True:
        try:
            chunk = os.read(ours, 4096)
        except OSError:  # the other end is closed: all read
            break
        if not chunk:
            break
        seen += chunk
    os.close(ours)
    assert done.returncode == 0
    assert out.startswith("fuzzed seed 5002: ")  # the result stays on standard output
    text = seen.decode()
    assert "\r1/1 seeds " in text
    assert text.endswith("\r")  # the line is blanked out at the end
    assert "\n" not in text


def test_json_gives_the_result_of_a_batch_that_held(tmp_path: Path) -> None:
    done = herdsman("sim", "fuzz", "--seeds", "2", "--seed", "5002", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["seeds"] == {"first": 5002, "asked": 2, "run": 2}
    assert report["held"] is True
    assert report["findings"] == []
    assert report["runs"] == draw_scenario(5002).run_count + draw_scenario(5003).run_count
    assert report["simulated_seconds"] > 0


def test_json_gives_a_finding_with_its_reproduction_and_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Supervisor, "conversation_busy", lambda self, w, c: False)
    case = tmp_path / "case.jsonl"
    code = main(["sim", "fuzz", "--seeds", "40", "--json", "--budget", "0", "--out", str(case)])
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    assert report["held"] is False
    (finding,) = report["findings"]
    seed = finding["seed"]
    assert report["seeds"]["run"] == seed + 1
    assert finding["violation"]["kind"] == "busy worktree removed"
    assert finding["reproduce"] == f"herdsman sim fuzz --seeds 1 --seed {seed}"
    assert finding["case"] == str(case)
    assert finding["replay"] == f"herdsman sim replay {case}"
    assert json.loads(case.read_text())["fuzz"]["seed"] == seed


def _digest(verdict: Verdict) -> str:
    text = json.dumps([verdict.traces, [str(v) for v in verdict.violations], verdict.span])
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.slow
def test_any_number_of_workers_gives_the_same_batch() -> None:
    batches, seen = [], []
    for workers in (1, 2):
        digests: list[tuple[int, str]] = []

        def keep(verdict: Verdict, into: list[tuple[int, str]] = digests) -> None:
            into.append((verdict.scenario.seed, _digest(verdict)))

        batch = fuzz_seeds(range(5000, 5005), keep, workers=workers)
        batches.append((batch.seeds, batch.runs, batch.faults, batch.simulated, batch.failure))
        seen.append(digests)
    assert batches[0] == batches[1]
    assert seen[0] == seen[1]
    assert [seed for seed, _ in seen[0]] == list(range(5000, 5005))


def test_the_help_says_what_the_command_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sim", "fuzz", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "A failing seed (a hang included) is reported with the command" in text
    assert "Progress goes to standard error." in text
    assert "--workers N" in text
    assert "--json" in text
