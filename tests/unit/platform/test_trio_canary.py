"""Canary: the trio internals the simulator's replay relies on are still there.

trio is pinned to one minor version (pyproject.toml) because the replay
reaches into its scheduler through ``herdsman.sim.trio_internals``, the one
module that reads trio's private names (docs/simulator.md, "What the
simulator relies on"): the module-level ``_r`` random generator and the
``_ALLOW_DETERMINISTIC_SCHEDULING`` flag (``shuffle_trio``), the run's
deadline heap (``next_deadline``), a ``MockClock``'s ``_virtual_base``
(``mock_time``), the runner's own ``wait_all_tasks_blocked`` (``settler``),
its queue of runnable tasks (``runnable``), its set of tasks (``tasks``), a
task's next send (``any_woken``), its checkpoint counts (``checkpoints``),
the runner's instruments (``plain_instruments``) and the process's cache
of worker threads (``WorkerJobs``). Each has a test here;
when an upgrade moves one, this fails first, with the reason, instead of
the simulator silently losing its reproducibility.
"""

from __future__ import annotations

import math
import random
import threading
import time
from importlib.metadata import version

import trio
import trio._core._run as trio_run
import trio._core._thread_cache as trio_thread_cache
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from trio._core._instrumentation import Instruments
from trio.testing import MockClock

from herdsman.sim.trio_internals import (
    WorkerJobs,
    any_woken,
    checkpoints,
    mock_time,
    next_deadline,
    plain_instruments,
    runnable,
    settler,
    shuffle_trio,
    tasks,
)


def test_trio_is_the_pinned_minor_version() -> None:
    assert version("trio").startswith("0.35."), (
        "trio was upgraded: re-check the internals below and docs/simulator.md, then move the pin"
    )


def test_the_scheduler_randomness_hooks_exist() -> None:
    assert isinstance(trio_run._r, random.Random)
    assert isinstance(trio_run._ALLOW_DETERMINISTIC_SCHEDULING, bool)


@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
@settings(max_examples=20, deadline=None)
def test_shuffle_trio_makes_the_wake_up_order_a_function_of_the_seed(seed: int) -> None:
    # The replay seeds trio's private scheduler randomness (trio_internals.
    # shuffle_trio): ten tasks woken in one batch must run in the same order
    # in two runs with the same seed.
    def wake_order() -> list[int]:
        order: list[int] = []

        async def main() -> None:
            event = trio.Event()

            async def waiter(index: int) -> None:
                await event.wait()
                order.append(index)

            async with trio.open_nursery() as nursery:
                for index in range(10):
                    nursery.start_soon(waiter, index)
                await trio.testing.wait_all_tasks_blocked()
                event.set()

        shuffle_trio(seed)
        trio.run(main)
        return order

    first = wake_order()
    assert sorted(first) == list(range(10))
    assert wake_order() == first


def test_mock_clock_autojump_runs_virtual_time() -> None:
    clock = MockClock(autojump_threshold=0)

    async def sleeper() -> float:
        await trio.sleep(3600)
        return trio.current_time()

    assert trio.run(sleeper, clock=clock) == 3600.0


@given(
    delays=st.lists(st.floats(min_value=0.5, max_value=1e6), max_size=6),
    cancelled=st.sets(st.integers(min_value=0, max_value=5)),
)
@settings(max_examples=50, deadline=None)
def test_the_replays_next_timer_is_what_trios_run_statistics_say(
    delays: list[float], cancelled: set[int]
) -> None:
    # The replay's driver reads trio's private deadline heap instead of
    # current_statistics() (trio_internals.next_deadline).
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            scopes = []
            for delay in delays:
                scope = trio.CancelScope(deadline=trio.current_time() + delay)
                scopes.append(scope)
                nursery.start_soon(_sleep_in, scope)
            for index in sorted(cancelled):
                if index < len(scopes):
                    scopes[index].cancel()
            await trio.testing.wait_all_tasks_blocked()
            expected = trio.lowlevel.current_statistics().seconds_to_next_deadline
            assert next_deadline() - trio.current_time() == expected
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock())


@given(
    jumps=st.lists(st.floats(min_value=0.0, max_value=1e7), max_size=8),
    sleeps=st.lists(st.floats(min_value=1e-6, max_value=1e6), max_size=4),
)
@settings(max_examples=100, deadline=None)
def test_the_replays_clock_read_is_the_mock_clocks_current_time(
    jumps: list[float], sleeps: list[float]
) -> None:
    # The replay reads a MockClock at rate 0 through its private
    # _virtual_base (trio_internals.mock_time): bit for bit what
    # current_time() says, after jumps and autojumps alike.
    clock = MockClock(autojump_threshold=0)
    now = mock_time(clock)
    assert now is not clock.current_time  # the private read, not the fallback
    seen: list[tuple[float, float]] = [(now(), clock.current_time())]

    async def main() -> None:
        for seconds in jumps:
            clock.jump(seconds)
            seen.append((now(), clock.current_time()))
            await trio.lowlevel.checkpoint()
            seen.append((now(), trio.current_time()))
        for seconds in sleeps:
            await trio.sleep(seconds)  # the autojump moves the clock
            seen.append((now(), trio.current_time()))

    trio.run(main, clock=clock)
    assert [math.copysign(1.0, a) for a, _ in seen] == [math.copysign(1.0, b) for _, b in seen]
    assert [a for a, _ in seen] == [b for _, b in seen]


@given(steps=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=6))
@settings(max_examples=50, deadline=None)
def test_the_replays_wait_for_blocked_tasks_is_trios_public_one(steps: list[int]) -> None:
    # The replay's driver awaits the runner's own wait_all_tasks_blocked
    # (trio_internals.settler) rather than trio.testing's wrapper around it:
    # it must return only once every other task is blocked, here each
    # after its own number of checkpoints, then a spawned task's too.
    done: list[int] = []

    async def busy(index: int, checkpoints: int) -> None:
        for _ in range(checkpoints):
            await trio.lowlevel.checkpoint()
        done.append(index)
        await trio.sleep_forever()

    async def main() -> None:
        settle = settler()
        assert settle == trio_run.GLOBAL_RUN_CONTEXT.runner.wait_all_tasks_blocked
        async with trio.open_nursery() as nursery:
            for index, checkpoints in enumerate(steps):
                nursery.start_soon(busy, index, checkpoints)
            await settle()
            assert sorted(done) == list(range(len(steps)))
            nursery.start_soon(busy, len(steps), steps[0])
            await settle()
            assert len(done) == len(steps) + 1
            nursery.cancel_scope.cancel()

    trio.run(main)


@given(
    waiters=st.lists(st.sampled_from(["event", "sleep", "forever"]), max_size=6),
    rounds=st.lists(st.lists(st.integers(min_value=0, max_value=7), max_size=4), max_size=4),
)
@settings(max_examples=100, deadline=None)
def test_the_replays_run_queue_is_what_trios_run_statistics_count(
    waiters: list[str], rounds: list[list[int]]
) -> None:
    # The replay's driver reads the runner's private run queue
    # (trio_internals.runnable) to skip its wait for blocked tasks after an
    # event that made no task runnable: its length is the statistics' count
    # of runnable tasks, and with it empty, a wait lets no other task run.
    ran: list[int] = []

    async def waiter(index: int, kind: str, event: trio.Event) -> None:
        if kind == "event":
            await event.wait()
        elif kind == "sleep":
            await trio.sleep(10)
        else:
            await trio.sleep_forever()
        ran.append(index)
        await trio.sleep_forever()

    async def main() -> None:
        queue = runnable()
        assert queue is trio_run.GLOBAL_RUN_CONTEXT.runner.runq
        settle = settler()
        events = [trio.Event() for _ in waiters]
        async with trio.open_nursery() as nursery:
            for index, kind in enumerate(waiters):
                nursery.start_soon(waiter, index, kind, events[index])
            await settle()
            assert not queue
            woken: set[int] = set()
            for setting in rounds:
                before = set(ran)
                for index in setting:  # no checkpoint in between: one round's doing
                    if index < len(events) and not events[index].is_set():
                        events[index].set()
                        if waiters[index] == "event":
                            woken.add(index)
                waking = woken - before
                assert len(queue) == trio.lowlevel.current_statistics().tasks_runnable
                assert len(queue) == len(waking)
                await settle()
                assert set(ran) == before | waking  # nothing else ran, if nothing was due
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock())


def test_a_running_mock_clock_is_read_as_usual() -> None:
    clock = MockClock(rate=1.0)
    assert mock_time(clock) == clock.current_time


async def _sleep_in(scope: trio.CancelScope) -> None:
    with scope:
        await trio.sleep_forever()


@given(
    steps=st.lists(
        st.sampled_from(
            ["sync", "checkpoint", "sleep0", "event", "cancelled", "shielded", "uncancelled"]
        )
    )
)
@settings(max_examples=100, deadline=None)
def test_a_tasks_checkpoint_counts_move_exactly_when_assert_no_checkpoints_fails(
    steps: list[str],
) -> None:
    # The replay's driver compares them around each event it delivers in
    # place of trio.testing.assert_no_checkpoints (trio_internals.checkpoints).
    async def main() -> None:
        task = trio.lowlevel.current_task()
        done = trio.Event()
        done.set()
        for step in steps:
            before = checkpoints(task)
            try:
                with trio.testing.assert_no_checkpoints():
                    await _step(step, done)
                public_yielded = False
            except AssertionError:
                public_yielded = True
            assert (checkpoints(task) != before) == public_yielded

    trio.run(main, clock=MockClock())


async def _step(step: str, done: trio.Event) -> None:
    if step == "checkpoint":
        await trio.lowlevel.checkpoint()
    elif step == "sleep0":
        await trio.sleep(0)
    elif step == "event":
        await done.wait()  # set already: still a checkpoint
    elif step == "shielded":
        await trio.lowlevel.cancel_shielded_checkpoint()  # a schedule point only
    elif step == "uncancelled":
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancel point only
    elif step == "cancelled":
        with trio.CancelScope() as scope:
            scope.cancel()
            await trio.lowlevel.checkpoint_if_cancelled()


def _descendants(task: trio.lowlevel.Task) -> set[trio.lowlevel.Task]:
    found = {task}
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            found |= _descendants(child)
    return found


@given(tree=st.lists(st.integers(min_value=0, max_value=8), max_size=8))
@settings(max_examples=50, deadline=None)
def test_the_replays_set_of_tasks_is_every_task_under_the_root(tree: list[int]) -> None:
    # The replay's driver reads the runner's private set of tasks
    # (trio_internals.tasks) to ride along with the tasks an event woke: it
    # must be every task of the run, as found down the public tree of nurseries, here
    # nested as ``tree`` says (each new task under an earlier one's nursery).
    async def main() -> None:
        nurseries: list[trio.Nursery] = []

        async def holder(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with trio.open_nursery() as nursery:
                nurseries.append(nursery)
                task_status.started()
                await trio.sleep_forever()

        async with trio.open_nursery() as top:
            nurseries.append(top)
            for parent in tree:
                await nurseries[parent % len(nurseries)].start(holder)
            root = trio.lowlevel.current_root_task()
            assert root is not None
            assert tasks() == _descendants(root)
            assert len(tasks()) == trio.lowlevel.current_statistics().tasks_living
            top.cancel_scope.cancel()

    trio.run(main)


@given(
    wakes=st.lists(st.lists(st.integers(min_value=0, max_value=5), max_size=6), max_size=6),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
@settings(max_examples=100, deadline=None)
def test_a_tasks_next_send_is_set_exactly_while_it_is_woken_and_not_yet_run(
    wakes: list[list[int]], seed: int
) -> None:
    # The replay's driver rides along with the tasks an event woke (sim/replay.py
    # _ride_along) until none is woken and not yet run (trio_internals.any_woken,
    # a task's private _next_send_fn): trio must set it as it reschedules it
    # and clear it as it runs it, so that, in a round whose order trio draws,
    # a task woken with the driver and run after it still has one when the
    # driver looks. Six parked tasks, woken
    # as ``wakes`` says, one round each; ``seed`` for trio's draw.
    random.seed(seed)
    waiting = [True] * 6  # parked, or blocked in a checkpoint's step not yet taken
    parked_tasks: dict[int, trio.lowlevel.Task] = {}

    async def parked(index: int, lot: trio.lowlevel.ParkingLot) -> None:
        parked_tasks[index] = trio.lowlevel.current_task()
        while True:
            waiting[index] = True
            await lot.park()
            if random.random() < 0.5:
                waiting[index] = False  # rescheduled at once: to run again
                await trio.lowlevel.checkpoint()

    async def main() -> None:
        lots = [trio.lowlevel.ParkingLot() for _ in waiting]
        me = trio.lowlevel.current_task()
        async with trio.open_nursery() as nursery:
            for index, lot in enumerate(lots):
                nursery.start_soon(parked, index, lot)
            await trio.testing.wait_all_tasks_blocked()
            for wake in wakes:
                for index in wake:
                    if lots[index].unpark():
                        waiting[index] = False
                assert not any_woken([me])
                await trio.lowlevel.cancel_shielded_checkpoint()
                assert any_woken(parked_tasks.values()) == (not all(waiting))
                for index, task in parked_tasks.items():
                    # Woken and not yet run (trio ran the driver first), or
                    # run and rescheduled: a next send; parked: none.
                    assert any_woken([task]) == (not waiting[index])
            nursery.cancel_scope.cancel()

    trio.run(main)


_HOOKS = ("before_io_wait", "after_io_wait", "before_task_step", "task_scheduled", "task_exited")


class _Hooked(trio.abc.Instrument):
    def __init__(self, hooks: list[str], seen: list[tuple[int, str]], index: int) -> None:
        for hook in hooks:
            setattr(self, hook, lambda *_, hook=hook: seen.append((index, hook)))


@given(
    instruments=st.lists(st.lists(st.sampled_from(_HOOKS), unique=True), max_size=4),
    changes=st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=3)), max_size=8),
)
@settings(max_examples=100, deadline=None)
def test_the_replays_plain_instruments_are_what_trios_own_hold(
    instruments: list[list[str]], changes: list[tuple[bool, int]]
) -> None:
    # The replay gives the run its instruments in a plain dict
    # (trio_internals.plain_instruments), reading the runner's private
    # ``instruments`` (a trio ``Instruments``, its hooks in ``data``) and borrowing its
    # methods: after the same adds and removes, it must hold what trio's
    # own would, and each hook must be called on it as on trio's.
    def run(plain: bool) -> tuple[list[tuple[int, str]], list[dict[str, set[int]]]]:
        seen: list[tuple[int, str]] = []
        held: list[dict[str, set[int]]] = []
        made: list[trio.abc.Instrument] = [
            _Hooked(hooks, seen, index) for index, hooks in enumerate(instruments)
        ]

        async def main() -> None:
            runner = trio_run.GLOBAL_RUN_CONTEXT.runner
            assert type(runner.instruments) is Instruments
            if plain:
                plain_instruments()
                assert isinstance(runner.instruments, dict)
            for add, index in changes:
                if index >= len(made):
                    continue
                if add:
                    trio.lowlevel.add_instrument(made[index])
                elif made[index] in runner.instruments.data["_all"]:
                    trio.lowlevel.remove_instrument(made[index])
                await trio.lowlevel.checkpoint()
                hooks = runner.instruments.data
                held.append({h: {made.index(i) for i in hooks[h]} for h in hooks})
            for instrument in list(runner.instruments.data["_all"]):
                trio.lowlevel.remove_instrument(instrument)

        trio.run(main)
        return seen, held

    (seen, held), (seen_by_trio, held_by_trio) = run(plain=True), run(plain=False)
    assert held == held_by_trio
    assert sorted(seen) == sorted(seen_by_trio)  # each hook as often (rounds may interleave)


def test_worker_jobs_counts_every_job_its_thread_hands_to_trios_worker_threads() -> None:
    # The simulator leaves its fake filesystem once a run's jobs in worker
    # threads are over (trio_internals.WorkerJobs): it puts a cache of its
    # own in the place of trio's private THREAD_CACHE, which both
    # trio.to_thread.run_sync and trio.lowlevel.start_thread_soon must read
    # at every call. A job from another thread is not counted.
    jobs = WorkerJobs()
    release = threading.Event()
    seen: list[int] = []

    def blocked() -> None:
        release.wait()

    async def main() -> None:
        jobs.count_here()
        assert type(trio_thread_cache.THREAD_CACHE) is not trio_thread_cache.ThreadCache
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, blocked)
            trio.lowlevel.start_thread_soon(blocked, lambda _: None)
            await trio.testing.wait_all_tasks_blocked()
            seen.append(jobs.running)
            elsewhere = threading.Thread(
                target=lambda: trio.lowlevel.start_thread_soon(blocked, lambda _: None)
            )
            elsewhere.start()
            elsewhere.join()
            seen.append(jobs.running)
            assert not jobs.wait_ended(time.monotonic() + 0.01)
            release.set()
        assert jobs.wait_ended(time.monotonic() + 60)
        seen.append(jobs.running)

    trio.run(main)
    assert seen == [2, 2, 0]
