"""``Scheduler.has_free_slot``: the O(1) question a caller asks before ``take_startable``."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from herdsman.core import Limits, RunRequest, Scheduler

PROVIDERS = ("claude", "codex")

# A step: probe a provider (submit a lone run of it and take what may start),
# or finish the running run at some position (modulo how many run).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("probe"), st.sampled_from(PROVIDERS)),
        st.tuples(st.just("finish"), st.integers(0, 20)),
    ),
    max_size=60,
)


@given(
    st.integers(0, 3),
    st.integers(0, 3),
    st.one_of(st.none(), st.integers(0, 4)),
    steps,
)
def test_a_free_slot_is_exactly_when_a_new_lone_run_starts_at_once(
    claude: int, codex: int, global_cap: int | None, plan: list[tuple[str, object]]
) -> None:
    scheduler = Scheduler(Limits({"claude": claude, "codex": codex}, global_cap))
    running: list[str] = []
    for number, (kind, arg) in enumerate(plan):
        if kind == "probe":
            assert isinstance(arg, str)
            # After take_startable nothing startable is left waiting, so a
            # new run without lanes starts now exactly when a slot is free.
            free = scheduler.has_free_slot(arg)
            scheduler.submit(RunRequest(f"r{number}", arg))
            started = [run.id for run in scheduler.take_startable()]
            assert started == ([f"r{number}"] if free else [])
            running += started
        elif running:
            assert isinstance(arg, int)
            scheduler.finish(running.pop(arg % len(running)))
            running += [run.id for run in scheduler.take_startable()]
    assert not scheduler.has_free_slot("gemini")  # an unconfigured provider has no slots


def test_a_finish_under_a_lowered_cap_leaves_the_provider_out_of_the_ready_index() -> None:
    # Three run, then a reload lowers the cap to one: a finish leaves two
    # running, still over the cap, so the queued run stays queued.
    scheduler = Scheduler(Limits({"claude": 3}))
    for number in range(4):
        scheduler.submit(RunRequest(f"r{number}", "claude"))
    assert [run.id for run in scheduler.take_startable()] == ["r0", "r1", "r2"]
    scheduler.set_limits(Limits({"claude": 1}))
    scheduler.finish("r0")
    assert "claude" not in scheduler.startable
    assert scheduler.take_startable() == []
    scheduler.finish("r1")
    scheduler.finish("r2")
    assert "claude" in scheduler.startable
    assert [run.id for run in scheduler.take_startable()] == ["r3"]
