"""Example tests, one or more per scheduling rule in docs/scheduling.md."""

from __future__ import annotations

import pytest

from herdsman.core import (
    CancelOutcome,
    Limits,
    RunRequest,
    RunState,
    Scheduler,
    SchedulerError,
    exclusion_keys,
)


def run(
    run_id: str,
    provider: str = "claude",
    conversation: str | None = None,
    agent: str | None = None,
    workspace: str = "default",
) -> RunRequest:
    return RunRequest(run_id, provider, conversation, agent, workspace)


def ids(runs: list[RunRequest]) -> list[str]:
    return [r.id for r in runs]


def make(caps: dict[str, int] | None = None, global_cap: int | None = None) -> Scheduler:
    return Scheduler(Limits(caps if caps is not None else {"claude": 8}, global_cap))


def test_keys_are_scoped_by_workspace_and_skip_missing_parts() -> None:
    assert exclusion_keys(run("r", conversation="c", agent="a"), agent_exclusive=True) == (
        "conversation:default/c",
        "agent:default/a",
    )
    assert exclusion_keys(run("r", conversation="c", agent="a"), agent_exclusive=False) == (
        "conversation:default/c",
    )
    assert exclusion_keys(run("r", agent="a", workspace="w"), agent_exclusive=True) == (
        "agent:w/a",
    )
    assert exclusion_keys(run("r"), agent_exclusive=True) == ()


def test_runs_of_one_conversation_never_overlap_and_start_in_order() -> None:
    s = make()
    for n in range(3):
        s.submit(run(f"r{n}", conversation="c"))
    assert ids(s.take_startable()) == ["r0"]
    assert s.take_startable() == []
    s.finish("r0")
    assert ids(s.take_startable()) == ["r1"]
    s.finish("r1")
    assert ids(s.take_startable()) == ["r2"]


def test_a_quick_run_is_not_held_up_by_a_long_run_in_another_conversation() -> None:
    s = make({"claude": 2})
    s.submit(run("long", conversation="a"))
    s.submit(run("a-followup", conversation="a"))
    s.submit(run("quick", conversation="b"))
    assert ids(s.take_startable()) == ["long", "quick"]
    s.finish("quick")
    s.submit(run("quick-2", conversation="b"))
    # "a-followup" waits for "long"; the free slot goes to conversation b.
    assert ids(s.take_startable()) == ["quick-2"]
    assert s.state_of("a-followup") is RunState.QUEUED


def test_fifo_per_key_holds_even_when_the_later_run_could_start_elsewhere() -> None:
    # r0 heads lane c but its provider is full; r1 (other provider, free) is
    # behind it in lane c and must not overtake it.
    s = make({"claude": 1, "codex": 1})
    s.submit(run("busy", provider="claude"))
    s.submit(run("r0", provider="claude", conversation="c"))
    s.submit(run("r1", provider="codex", conversation="c"))
    s.submit(run("other", provider="codex"))
    assert ids(s.take_startable()) == ["busy", "other"]
    s.finish("other")
    assert s.take_startable() == []
    s.finish("busy")
    assert ids(s.take_startable()) == ["r0"]
    s.finish("r0")
    assert ids(s.take_startable()) == ["r1"]


def test_one_agent_never_runs_twice_at_once_in_a_workspace() -> None:
    s = make()
    s.submit(run("a1", conversation="c1", agent="reviewer"))
    s.submit(run("a2", conversation="c2", agent="reviewer"))
    s.submit(run("b1", conversation="c3", agent="reviewer", workspace="other"))
    # Same agent id in another workspace does not block.
    assert ids(s.take_startable()) == ["a1", "b1"]
    s.finish("a1")
    assert ids(s.take_startable()) == ["a2"]


def test_agent_exclusivity_off_lets_one_agent_run_in_parallel() -> None:
    s = Scheduler(Limits({"claude": 8}), agent_exclusive=False)
    s.submit(run("a1", conversation="c1", agent="reviewer"))
    s.submit(run("a2", conversation="c2", agent="reviewer"))
    assert ids(s.take_startable()) == ["a1", "a2"]


def test_switching_agent_exclusivity_on_waits_for_every_running_run_of_the_agent() -> None:
    s = Scheduler(Limits({"claude": 8}), agent_exclusive=False)
    s.submit(run("a1", conversation="c1", agent="x"))
    s.submit(run("a2", conversation="c2", agent="x"))
    assert ids(s.take_startable()) == ["a1", "a2"]
    s.submit(run("a3", conversation="c3", agent="x"))
    s.set_agent_exclusive(True)
    assert s.take_startable() == []
    s.finish("a1")
    assert s.take_startable() == []
    s.finish("a2")
    assert ids(s.take_startable()) == ["a3"]


def test_switching_agent_exclusivity_off_releases_waiting_runs() -> None:
    s = make()
    s.submit(run("a1", conversation="c1", agent="x"))
    s.submit(run("a2", conversation="c2", agent="x"))
    assert ids(s.take_startable()) == ["a1"]
    s.set_agent_exclusive(False)
    assert ids(s.take_startable()) == ["a2"]


def test_runs_without_a_conversation_each_have_a_lane_of_their_own() -> None:
    s = make({"claude": 3})
    for n in range(3):
        s.submit(run(f"r{n}"))
    assert ids(s.take_startable()) == ["r0", "r1", "r2"]


def test_provider_cap_and_global_cap() -> None:
    s = make({"claude": 2, "codex": 2}, global_cap=3)
    for n in range(3):
        s.submit(run(f"cl{n}", provider="claude"))
        s.submit(run(f"cx{n}", provider="codex"))
    # Earliest submitted first; claude's third run waits for claude's cap.
    assert ids(s.take_startable()) == ["cl0", "cx0", "cl1"]
    s.finish("cl0")
    assert ids(s.take_startable()) == ["cx1"]
    snap = s.snapshot()
    assert snap.running_by_provider == {"claude": 1, "codex": 2}
    assert snap.queued_by_provider == {"claude": 1, "codex": 1}
    assert (s.running_for("codex"), s.queued_for("codex"), s.queued_for("nope")) == (2, 1, 0)


def test_earliest_submitted_free_run_goes_first_across_providers() -> None:
    s = make({"claude": 1, "codex": 1}, global_cap=1)
    s.submit(run("cx0", provider="codex"))
    s.submit(run("cl0", provider="claude"))
    assert ids(s.take_startable()) == ["cx0"]
    s.finish("cx0")
    assert ids(s.take_startable()) == ["cl0"]


def test_lowering_a_cap_from_4_to_1_with_4_running_starts_nothing_until_3_finish() -> None:
    s = make({"claude": 4})
    for n in range(6):
        s.submit(run(f"r{n}"))
    assert ids(s.take_startable()) == ["r0", "r1", "r2", "r3"]
    s.set_limits(Limits({"claude": 1}))
    assert s.running_count == 4  # nothing was stopped
    for finished in ("r0", "r1", "r2"):
        assert s.take_startable() == []
        s.finish(finished)
    assert s.take_startable() == []  # r3 still holds the only slot
    s.finish("r3")
    assert ids(s.take_startable()) == ["r4"]


def test_raising_a_cap_starts_queued_runs_at_once() -> None:
    s = make({"claude": 1})
    for n in range(3):
        s.submit(run(f"r{n}"))
    assert ids(s.take_startable()) == ["r0"]
    s.set_limits(Limits({"claude": 3}))
    assert ids(s.take_startable()) == ["r1", "r2"]


def test_a_provider_without_a_cap_keeps_its_runs_queued_without_blocking_others() -> None:
    s = make({"claude": 1})
    s.submit(run("gone", provider="removed"))
    s.submit(run("ok", provider="claude"))
    assert ids(s.take_startable()) == ["ok"]
    assert s.state_of("gone") is RunState.QUEUED


def test_cancel_a_queued_run_frees_its_lane_for_the_next() -> None:
    s = make({"claude": 2})
    s.submit(run("r0", conversation="c"))
    s.submit(run("r1", conversation="c"))
    s.submit(run("r2", conversation="c"))
    assert ids(s.take_startable()) == ["r0"]
    assert s.cancel("r1") is CancelOutcome.REMOVED
    s.finish("r0")
    assert ids(s.take_startable()) == ["r2"]
    assert s.state_of("r1") is None


def test_cancelling_queued_runs_promotes_the_next_live_run_in_the_lane() -> None:
    s = make({"claude": 2})
    s.submit(run("blocker", conversation="b"))
    s.submit(run("r0", conversation="c", agent="x"))
    s.submit(run("r1", conversation="c"))
    s.submit(run("r2", conversation="c"))
    # Hold agent x so r0 cannot start: r0 heads lane c but is not ready.
    s.submit(run("holder", conversation="h", agent="x"))
    assert ids(s.take_startable()) == ["blocker", "r0"]
    s.finish("r0")
    assert ids(s.take_startable()) == ["r1"]
    s.finish("r1")
    assert ids(s.take_startable()) == ["r2"]
    s.finish("r2")
    assert ids(s.take_startable()) == ["holder"]
    # Now the tombstone case proper: cancel the head, then the one behind it.
    s.submit(run("q0", conversation="q"))
    s.submit(run("q1", conversation="q"))
    s.submit(run("q2", conversation="q"))
    assert s.take_startable() == []  # both slots busy (blocker, holder)
    s.cancel("q0")
    s.cancel("q1")
    s.finish("blocker")
    assert ids(s.take_startable()) == ["q2"]


def test_cancel_reports_running_and_unknown_runs() -> None:
    s = make()
    s.submit(run("r0"))
    s.take_startable()
    assert s.cancel("r0") is CancelOutcome.RUNNING
    assert s.state_of("r0") is RunState.RUNNING
    assert s.cancel("nope") is CancelOutcome.UNKNOWN
    s.finish("r0")
    assert s.cancel("r0") is CancelOutcome.UNKNOWN


def test_protocol_errors_are_reported() -> None:
    s = make()
    s.submit(run("r0"))
    with pytest.raises(SchedulerError, match="already queued or running"):
        s.submit(run("r0"))
    with pytest.raises(SchedulerError, match="is not running"):
        s.finish("r0")
    with pytest.raises(ValueError, match="cap must be >= 0"):
        Limits({"claude": -1})


def test_snapshot_counts_lanes_including_lone_runs() -> None:
    s = make({"claude": 1})
    s.submit(run("r0", conversation="c", agent="a"))
    s.submit(run("r1", conversation="c"))
    s.submit(run("lone"))
    assert ids(s.take_startable()) == ["r0"]
    snap = s.snapshot()
    assert snap.queued == 2
    assert snap.running == 1
    assert snap.queued_by_lane == {"conversation:default/c": 1, "run:default/lone": 1}
    assert list(s.queued_runs()) == [run("r1", conversation="c"), run("lone")]
    assert list(s.running_runs()) == [run("r0", conversation="c", agent="a")]


def test_same_calls_give_same_decisions() -> None:
    def drive() -> list[list[str]]:
        s = make({"claude": 2, "codex": 1}, global_cap=2)
        out = []
        for n in range(40):
            s.submit(
                run(
                    f"r{n}",
                    provider=("claude", "codex")[n % 2],
                    conversation=f"c{n % 5}" if n % 3 else None,
                    agent=f"a{n % 4}" if n % 2 else None,
                )
            )
            started = s.take_startable()
            out.append(ids(started))
            if n % 3 == 0 and started:
                s.finish(started[0].id)
        return out

    assert drive() == drive()


def test_is_busy_reports_a_queued_or_running_run_on_a_shared_key() -> None:
    s = make({"claude": 1})
    probe_conv = run("probe", conversation="c")
    probe_agent = run("probe", conversation="other", agent="a")
    assert not s.is_busy(probe_conv)
    s.submit(run("r0", conversation="c", agent="a"))
    assert s.is_busy(probe_conv)  # queued
    assert s.is_busy(probe_agent)
    s.take_startable()
    assert s.is_busy(probe_conv)  # running
    s.finish("r0")
    assert not s.is_busy(probe_conv)
    assert not s.is_busy(probe_agent)
    assert not s.is_busy(run("probe"))  # a lone run is never busy


def at(run_id: str, cwd: str, provider: str = "claude") -> RunRequest:
    return RunRequest(run_id, provider, cwd=cwd)


def test_runs_in_overlapping_directories_never_run_together() -> None:
    s = make()
    s.submit(at("outer", "/repo"))
    s.submit(at("inner", "/repo/sub"))
    s.submit(at("same", "/repo"))
    s.submit(at("sibling", "/other"))
    s.submit(at("cousin", "/repo-two"))  # a prefix as text, not as a path
    assert ids(s.take_startable()) == ["outer", "sibling", "cousin"]
    s.finish("outer")
    assert ids(s.take_startable()) == ["inner"]
    s.finish("inner")
    assert ids(s.take_startable()) == ["same"]


def test_disjoint_subtrees_run_side_by_side_and_wait_for_their_ancestor() -> None:
    s = make()
    s.submit(at("root", "/"))
    for name in ("a", "b", "c"):
        s.submit(at(name, f"/repo/{name}"))
    assert ids(s.take_startable()) == ["root"]
    s.finish("root")
    # Released together: none of them contains another.
    assert ids(s.take_startable()) == ["a", "b", "c"]


def test_fifo_holds_across_nested_directories() -> None:
    # "first" (/repo) cannot start (its provider is full) and so holds back the
    # later "second" (/repo/x), though second's own provider is free.
    s = make({"claude": 1, "codex": 1})
    s.submit(at("busy", "/elsewhere"))
    s.submit(at("first", "/repo"))
    s.submit(at("second", "/repo/x", provider="codex"))
    assert ids(s.take_startable()) == ["busy"]
    s.finish("busy")
    assert ids(s.take_startable()) == ["first"]
    s.finish("first")
    assert ids(s.take_startable()) == ["second"]


def test_a_relative_cwd_is_refused() -> None:
    with pytest.raises(ValueError, match="cwd must be an absolute path"):
        RunRequest("r", "claude", cwd="repo/sub")


def test_a_cancelled_run_put_back_in_its_place_starts_there() -> None:
    # A refused cancel puts the run back with its own seq while its
    # tombstone still sits in the ready heap: the two must not be compared.
    s = Scheduler(Limits({"p": 0}))
    s.submit(RunRequest("a", "p", "c"))
    s.submit(RunRequest("b", "p", "c"))
    seq = s.seq_of("a")
    assert s.cancel("a") is CancelOutcome.REMOVED
    s.submit(RunRequest("a", "p", "c"), seq=seq)
    s.set_limits(Limits({"p": 1}))
    assert [r.id for r in s.take_startable()] == ["a"]
    s.finish("a")
    assert [r.id for r in s.take_startable()] == ["b"]
