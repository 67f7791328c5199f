"""The fuzzer's fleet: members on one simulated ledger, one killed at a random moment (D5).

Real supervisors as fleet members share ``SimFleet`` under one MockClock;
a member is killed as SIGKILL kills it; the invariants are checked on the
agents' real lifetimes, fleet-wide. With the fence keeper modelled as
production guarantees it, nothing breaks; without it, or without the
margin the other members give it, the fuzzer finds the overlap.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_workloads import herdsman

from herdsman.cli import main
from herdsman.runtime.fence_keeper import SLICE
from herdsman.sim.fuzz import fleet_scenario
from herdsman.sim.fuzz.fleet_agents import Agents, SimFence
from herdsman.sim.fuzz.fleet_harness import FleetVerdict, run_fleet_scenario
from herdsman.sim.fuzz.fleet_scenario import FleetScenario, draw_fleet_scenario

SEEDS = range(40)


def lost_by_the_kill(verdict: FleetVerdict) -> list[str]:
    """Runs the killed member held when it died: recorded lost by its lease's expiry."""
    return [run_id for run_id, status, reason in verdict.ledger if status == "lost" and reason]


def kinds(verdict: FleetVerdict) -> set[str]:
    return {violation.kind for violation in verdict.violations}


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    member=st.integers(0, 2),
    moment=st.floats(0.2, 25.0, allow_nan=False),
)
def test_a_member_killed_at_any_moment_leaves_no_overlap_and_the_cap_holds(
    seed: int, member: int, moment: float
) -> None:
    scenario = attrs.evolve(
        draw_fleet_scenario(seed), kill={"member": member, "t": round(moment, 4)}
    )
    verdict = run_fleet_scenario(scenario)
    assert verdict.violations == (), [str(v) for v in verdict.violations]


def events(verdict: FleetVerdict, member: int) -> list[dict[str, Any]]:
    """Member ``member``'s trace events, its header left out."""
    return [json.loads(line) for line in verdict.traces[member].splitlines()[1:]]


def test_a_member_killed_between_its_poll_and_its_claim_claims_and_spawns_nothing() -> None:
    """Seed 3638, member 0 killed at 2.0 (found by hypothesis): at that instant its
    poll read r02 and woke its dispatcher, then the kill came, then the dispatcher,
    already scheduled, ran on to its next checkpoint: it claimed r02 on the cut-off
    copy of the ledger and its run task spawned the agent, while member 2 claimed
    r02 in the real ledger 27 ms later: two agents of r02."""
    scenario = attrs.evolve(draw_fleet_scenario(3638), kill={"member": 0, "t": 2.0})
    verdict = run_fleet_scenario(scenario)
    assert verdict.violations == (), [str(v) for v in verdict.violations]
    # The boundary this seed reaches: the kill fell right after the poll
    # (the last thing member 0 traced) and before any start of it.
    last = events(verdict, 0)[-3:]
    assert [(e["t"], e["event"]) for e in last] == [(2.0, "poll"), (2.0, "submit"), (2.0, "submit")]
    assert last[0]["runs"] == ["r02", "r01"]
    # r02's agent was spawned once, by the member that claimed it in the ledger.
    assert [(run, member) for run, member, _, _ in verdict.lives if run == "r02"] == [("r02", 2)]


@pytest.mark.parametrize("seed", [0, 2, 3638])
def test_a_member_killed_at_the_instant_of_any_of_its_polls_or_claims_breaks_nothing(
    seed: int,
) -> None:
    """A kill at the very instant a member polls or claims: tasks of it already
    scheduled then run on to their next checkpoint, and must reach nothing."""
    unkilled = run_fleet_scenario(attrs.evolve(draw_fleet_scenario(seed), kill=None))
    instants = sorted(
        {
            (member, float(event["t"]))
            for member in range(len(unkilled.traces))
            for event in events(unkilled, member)
            if event["event"] in ("poll", "start")
        }
    )
    assert any(member == 0 for member, _ in instants)
    for member, moment in instants:
        scenario = attrs.evolve(draw_fleet_scenario(seed), kill={"member": member, "t": moment})
        verdict = run_fleet_scenario(scenario)
        assert verdict.violations == (), (member, moment, [str(v) for v in verdict.violations])


def test_the_faults_bite_their_runs_are_lost_and_their_conversations_go_on_elsewhere() -> None:
    verdicts = [run_fleet_scenario(draw_fleet_scenario(seed)) for seed in SEEDS]
    assert all(not verdict.failed for verdict in verdicts)
    bitten = [verdict for verdict in verdicts if lost_by_the_kill(verdict)]
    # The faults took effect in many seeds: the member killed (or cut off
    # past its lease) held running runs.
    assert len(bitten) >= len(SEEDS) // 4
    fell = 0
    for verdict in bitten:
        scenario = verdict.scenario
        assert scenario.kill is not None
        faulty = {scenario.kill["member"]}
        if scenario.partition is not None:
            faulty.add(scenario.partition["member"])
        for run_id in lost_by_the_kill(verdict):
            (reason,) = [r for i, s, r in verdict.ledger if i == run_id]
            (life,) = [life for life in verdict.lives if life[0] == run_id]
            assert life[1] in faulty
            assert reason == f"supervisor member-{life[1]}:{1000 + life[1]} lease expired"
            assert life[3] is not None
            fell += life[1] != scenario.kill["member"]
    # A member cut off past its lease, alive, lost runs too: its fence fell.
    assert fell
    # Clients' cancels, through any member, took effect.
    assert any(status == "cancelled" for verdict in verdicts for _, status, _ in verdict.ledger)
    # A member that joined after the kill, on a fresh state directory, ran runs.
    assert any(life[1] == 3 for verdict in verdicts for life in verdict.lives)
    # Nothing of the members reached the real disk (no pyfakefs here: none is needed).
    assert not Path("/herdsman-sim").exists()


def test_without_the_fence_the_fuzzer_finds_the_overlap_and_the_cap_exceeded() -> None:
    found: set[str] = set()
    for seed in SEEDS:
        verdict = run_fleet_scenario(attrs.evolve(draw_fleet_scenario(seed), fence=False))
        found |= kinds(verdict)
    assert {"overlap", "fleet cap", "outlived its run"} <= found


def test_without_the_margin_the_fence_s_last_slice_overlaps_the_next_run() -> None:
    """The model is no stronger than production: the keeper may kill a slice late."""
    overlaps = []
    for seed in range(60):
        verdict = run_fleet_scenario(attrs.evolve(draw_fleet_scenario(seed), margin=0.0))
        overlaps += [v for v in verdict.violations if v.kind == "overlap"]
    assert overlaps
    assert all("killed by its member's fence keeper" in v.message for v in overlaps)


@pytest.mark.parametrize("seed", [1, 5, 9, 13, 21, 34, 56])
def test_a_seed_reproduces_exactly_whatever_trio_s_wake_up_order(seed: int) -> None:
    scenario = draw_fleet_scenario(seed)
    first = run_fleet_scenario(scenario)
    again = run_fleet_scenario(scenario)
    shuffled = run_fleet_scenario(scenario, wake_seed=seed + 7919)
    for other in (again, shuffled):
        assert other.lives == first.lives
        assert other.ledger == first.ledger
        assert other.traces == first.traces
        assert other.violations == first.violations
    assert draw_fleet_scenario(seed) == scenario


def test_a_fleet_needs_two_members() -> None:
    with pytest.raises(ValueError, match="at least 2 members"):
        draw_fleet_scenario(1, members=1)


def test_each_member_has_a_state_directory_of_its_own() -> None:
    scenario = draw_fleet_scenario(3)
    assert 'state_dir = "/herdsman-sim/member-0"' in scenario.config(0)
    assert 'state_dir = "/herdsman-sim/member-1"' in scenario.config(1)
    assert f"provider_caps = {{ demo = {scenario.cap} }}" in scenario.config(1)
    assert scenario.as_json()["kill"] == scenario.kill


# --- the pieces -----------------------------------------------------------------


def _in_trio(test: object) -> None:
    trio.run(test, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_a_fence_extended_in_time_holds_and_one_extended_late_has_fallen() -> None:
    async def main() -> None:
        agents = Agents(fence=True)
        fence = SimFence(0, 3.0, agents)
        await trio.sleep(2.0)
        assert fence.extend(6.0)
        life = agents.spawned("r1", 0, "c1", 100.0)
        await trio.sleep(4.5)  # past 6.0
        assert not fence.extend(9.0)
        assert fence.fallen is not None
        # Its agent died one slice after the deadline it held.
        assert life.end == pytest.approx(6.0 + SLICE)
        # Fired for good: an agent spawned later dies within a slice.
        late = agents.spawned("r2", 0, "c2", 100.0)
        assert late.end == pytest.approx(trio.current_time() + SLICE)
        assert await fence.wait_fallen() == fence.fallen

    _in_trio(main)


def test_the_fence_falls_by_itself_when_its_deadline_passes() -> None:
    async def main() -> None:
        agents = Agents(fence=True)
        fence = SimFence(1, 2.0, agents)
        why = await fence.wait_fallen()
        assert "not renewed" in why
        assert trio.current_time() == pytest.approx(2.0)

    _in_trio(main)


def test_a_killed_member_s_agents_live_until_its_fence_or_their_work_ends() -> None:
    async def main() -> None:
        fenced, unfenced = Agents(fence=True), Agents(fence=False)
        fence = SimFence(0, 5.0, fenced)
        long_one = fenced.spawned("r1", 0, "c1", 100.0)
        short_one = fenced.spawned("r2", 0, "c2", 1.0)
        bare = unfenced.spawned("r1", 0, "c1", 100.0)
        fenced.member_died(0, fence)
        unfenced.member_died(0, fence)
        assert long_one.end == pytest.approx(5.0 + SLICE)
        assert short_one.end == pytest.approx(1.0)
        assert bare.end == pytest.approx(100.0)

    _in_trio(main)


def test_an_agent_alive_after_its_run_was_recorded_ended_is_found() -> None:
    async def main() -> None:
        agents = Agents(fence=False)
        done = agents.spawned("r1", 0, "c1", 5.0)
        orphan = agents.spawned("r2", 0, "c2", 50.0)
        await trio.sleep(5.0)
        agents.ended(done)
        agents.member_died(0, SimFence(0, 10.0, agents))
        assert orphan.end == pytest.approx(50.0)
        found = agents.outlived({"r1": 5.0, "r2": 12.0})
        assert [(v.kind, v.t) for v in found] == [("outlived its run", 12.0)]
        assert "alive until t=50.000" in found[0].message

    _in_trio(main)


def test_the_checks_see_an_overlap_a_cap_exceeded_and_a_second_spawn() -> None:
    async def main() -> None:
        agents = Agents(fence=True)
        first = agents.spawned("r1", 0, "c1", 10.0)
        await trio.sleep(1.0)
        second = agents.spawned("r2", 1, "c1", 10.0)
        agents.spawned("r1", 1, None, 1.0)
        await trio.sleep(2.0)
        agents.ended(first)
        agents.ended(second)
        found = agents.violations(cap=2, until=20.0)
        assert [v.kind for v in found] == ["at most once", "overlap", "fleet cap"]
        assert agents.violations(cap=3, until=20.0)[1:2] == found[1:2]

    _in_trio(main)


def test_a_scenario_s_runs_come_in_time_order() -> None:
    scenario: FleetScenario = draw_fleet_scenario(8)
    times = [float(run["t"]) for run in scenario.runs]
    assert times == sorted(times)
    assert len(set(times)) == len(times)


# --- the command ------------------------------------------------------------------


def test_sim_fuzz_fleet_runs_the_seeds_and_says_every_invariant_held(tmp_path: Path) -> None:
    done = herdsman("sim", "fuzz", "--fleet", "3", "--seeds", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("fuzzed fleet seeds 0..2 (3 members, one killed in each): ")
    assert done.stdout.rstrip().endswith("every invariant held")
    as_json = herdsman("sim", "fuzz", "--fleet", "3", "--seeds", "3", "--json", cwd=tmp_path)
    assert json.loads(as_json.stdout)["held"] is True


def test_sim_fuzz_fleet_reports_a_broken_invariant_with_its_reproduction(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def unfenced(seed: int, *, members: int = 3) -> FleetScenario:
        return attrs.evolve(draw_fleet_scenario(seed, members=members), fence=False)

    monkeypatch.setattr(fleet_scenario, "draw_fleet_scenario", unfenced)
    assert main(["sim", "fuzz", "--fleet", "3", "--seeds", "40"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fleet seed ")
    assert out[1].split(": ", 2)[1] in {"overlap", "fleet cap", "outlived its run"}
    seed = out[0].split()[2]
    assert out[2] == f"reproduce: herdsman sim fuzz --fleet 3 --seeds 1 --seed {seed}"


def test_sim_fuzz_fleet_refuses_flags_it_has_no_use_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sim", "fuzz", "--fleet", "2", "--seeds", "1", "--out", "x.jsonl"]) == 2
    assert "leave out --out" in capsys.readouterr().err
