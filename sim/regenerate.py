"""Replay every shipped input and write its golden output (``NAME.golden.jsonl``).

Run after a change that is meant to alter decisions or the trace format,
then look at ``git diff sim/`` (or ``herdsman sim diff``) before committing:

    .venv/bin/python sim/regenerate.py
"""

from __future__ import annotations

import logging
from pathlib import Path

from herdsman.sim.fleet_replay import fleet_replay, read_member
from herdsman.sim.replay import replay
from herdsman.sim.workload import config_from_trace, read_workload

HERE = Path(__file__).parent
INPUTS = (
    "demo-recorded",
    "team-day",
    "stop-forced",
    "stop-killed",
    "stop-restarted",
    "sweeps-recorded",
    "faults-recorded",
)
#: A fleet's members' traces, replayed together (``sim replay A B C --out-dir``).
FLEETS = (("fleet-m0", "fleet-m1", "fleet-m2"),)


def golden(name: str) -> str:
    """The replay of ``sim/NAME.jsonl`` under its own configuration."""
    workload = read_workload(HERE / f"{name}.jsonl")
    return replay(workload, config_from_trace(workload.header.config, f"{name} header")).trace


def fleet_goldens(names: tuple[str, ...]) -> tuple[str, ...]:
    """The replay of ``sim/NAME.jsonl`` for each member of a fleet, together."""
    members = [read_member(HERE / f"{name}.jsonl") for name in names]
    configs = [
        config_from_trace(member.workload.header.config, f"{member.name} header")
        for member in members
    ]
    return fleet_replay(members, configs).traces


def main() -> None:
    logging.getLogger("herdsman").setLevel(logging.ERROR)
    for name in INPUTS:
        (HERE / f"{name}.golden.jsonl").write_text(golden(name), encoding="utf-8")
        print(f"wrote sim/{name}.golden.jsonl")
    for names in FLEETS:
        for name, text in zip(names, fleet_goldens(names), strict=True):
            (HERE / f"{name}.golden.jsonl").write_text(text, encoding="utf-8")
            print(f"wrote sim/{name}.golden.jsonl")


if __name__ == "__main__":
    main()
