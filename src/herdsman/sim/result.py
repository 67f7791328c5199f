"""What a simulation engine hands back: the simulated trace and the summary line's figures."""

from __future__ import annotations

import math

import attrs

from herdsman.sim.workload import DEFAULT_DURATION, Workload

__all__ = ["ReplayResult", "summary"]


@attrs.frozen
class ReplayResult:
    """The simulated trace and what the summary line reports."""

    trace: str
    runs: int
    span: float
    wall_seconds: float
    #: Runs the recording never started, given DEFAULT_DURATION.
    defaulted: tuple[str, ...]
    #: Runs still queued at the end (no provider, no account, or a shutdown first).
    left_queued: int = 0
    #: The recorded file was rotated at this time: later decisions are the replay's own.
    rotated_at: float | None = None
    #: Which engine simulated: "trio" (the whole supervisor) or "fast" (the cores).
    engine: str = "trio"
    #: When the recording's supervisor was asked to shut down (nothing started after).
    shutdown_at: float | None = None
    #: When the recording ends with runs still running and no shutdown (a kill).
    cut_at: float | None = None
    #: Runs the recording found lost at its start (``Workload.lost``).
    lost_at_start: int = 0
    #: A fleet member's recording: runs submitted in it that it never started.
    elsewhere: int | None = None
    #: Submits that waited for a sweep's removal, not held (``Workload.unheld``).
    unheld: tuple[tuple[str, float], ...] = ()
    #: Failed attempts whose finish names no failure class (``Workload.unclassed``).
    unclassed: tuple[tuple[str, float], ...] = ()
    #: The recording's supervisor had no retry policies (``Workload.predates_retries``).
    predates_retries: bool = False


def recording_ends(result: ReplayResult, workload: Workload) -> ReplayResult:
    """``result`` with how its recording ended: what explains runs left over."""
    shutdown_at = next((a.t for a in workload.arrivals if a.kind == "shutdown"), None)
    fleet = workload.header.config.get("fleet") or {}
    elsewhere = None
    if fleet.get("enabled"):
        # Another member started them, or nobody did before the end: this
        # trace cannot tell which, nor when the others held their lanes.
        elsewhere = sum(
            1 for plan in workload.plans.values() if not plan.attempts and not plan.synthetic
        )
    # A recording cut short ran until its last event even when the replay's
    # clock stopped sooner (its last run started at an earlier submit, and
    # never ends): the replay stands for that much of it.
    span = result.span if workload.cut_at is None else max(result.span, workload.cut_at)
    return attrs.evolve(
        result,
        span=span,
        shutdown_at=shutdown_at,
        cut_at=workload.cut_at,
        lost_at_start=len(workload.lost),
        elsewhere=elsewhere,
        unheld=workload.unheld,
        unclassed=workload.unclassed,
        predates_retries=workload.predates_retries,
    )


def summary(result: ReplayResult) -> str:
    """The line printed on stderr after a replay.

    Moments (``t=``) are trace time to the millisecond, as ``sim diff`` and
    the replay's bounds print them: ``t=14.957``, ``t=42.894``.
    """
    rate = result.runs / result.wall_seconds if result.wall_seconds > 0 else math.inf
    line = (
        f"replayed {result.runs} runs"
        + (" with the fast engine" if result.engine == "fast" else "")
        + f" over {result.span:.1f} simulated seconds"
        f" in {result.wall_seconds:.2f} s wall ({rate:,.0f} runs per wall second)"
    )
    if result.rotated_at is not None:
        line += (
            f"; the recording was rotated into another file at t={result.rotated_at:.3f}:"
            " what the replay decided after that is its own"
        )
    if result.elsewhere is not None:
        line += (
            f"; this is a fleet member's trace: {result.elsewhere} run(s) submitted in it were"
            " never started by this member, and when the other members ran theirs (holding"
            " lanes and fleet-wide caps) is not in it, so the replay, one supervisor alone,"
            " decides for itself from the first of those on"
        )
    if result.lost_at_start:
        line += _lost_at_start(result)
    if result.unheld:
        run_id, began = result.unheld[0]
        line += (
            f"; {len(result.unheld)} submit(s) that waited for a sweep's removal of their"
            f" conversation's worktrees are not held (the first: {run_id}, from t={began:.3f}):"
            " another submit to the conversation was recorded during the wait, and the"
            " replay holds one run a conversation; each goes in at its recorded submit, so"
            " a skip during its wait may be decided otherwise"
        )
    if result.unclassed:
        line += _unclassed(result)
    if result.cut_at is not None:
        line += (
            f"; the recording ends at t={result.cut_at:.3f} with runs still running and no"
            " shutdown (the supervisor was killed, or the file was read while it ran):"
            " those never end in the replay"
        )
    if result.left_queued:
        line += f"; {result.left_queued} run(s) were still queued at the end" + (
            f" (the recorded shutdown at t={result.shutdown_at:.3f} stopped new starts)"
            if result.shutdown_at is not None
            else " (the recording ended first)"
            if result.cut_at is not None
            else " (their provider is not configured, or no account could take them)"
        )
    if result.defaulted:
        line += (
            f"; {len(result.defaulted)} run(s) never started in the recording were given"
            f" the default duration of {DEFAULT_DURATION:g} s"
        )
    return line


def _lost_at_start(result: ReplayResult) -> str:
    """What the summary says of the runs the recording found lost as it started.

    Said by both engines: a file that begins with a restart may hold
    nothing else, and "replayed 0 runs" alone reads as an empty trace.
    """
    found = f"; the recording begins with {result.lost_at_start} run(s) found lost at start-up"
    if result.engine == "fast":
        # It has no ledger for a recovery to find them in.
        return found + ", which the fast engine does not replay (use --engine trio)"
    # What replay._seed_lost sets up: the replay's own recovery decides again.
    return found + (
        " (left running by the supervisor before it): the replay puts them in its ledger"
        " as running, and its recovery records them lost as the recorded one did (they"
        " are not among the runs replayed)"
    )


def _unclassed(result: ReplayResult) -> str:
    """What the summary says of failed attempts whose trace names no failure class.

    The replay cannot know their class, so it retries none of them; it says
    so without guessing why the class is missing unless the trace tells.
    """
    run_id, at = result.unclassed[0]
    first = f"(the first: {run_id}'s at t={at:.3f})"
    count = len(result.unclassed)
    if result.predates_retries:
        return (
            f"; the recording predates retries: its {count} failed attempt(s) {first} name no"
            " failure class, so the replay retries none of them, whatever the retry policy"
        )
    return (
        f"; {count} failed attempt(s) {first} name no failure class (a failure no policy"
        " retries, such as billing or a refused request, or a trace written before finishes"
        " named their class): the replay retries none of them, whatever the retry policy"
    )
