"""The fuzzer's check of ``removal_wait``: a submit traced as waiting for a removal did wait.

A replay holds a run from its ``removal_wait`` to its ``submit`` as if a
removal of its conversation's worktrees were under way (docs/simulator.md,
"Worktree sweeps in a replay"). A wait traced with no such removal under
way would make a replay hold a run the supervisor never held; a run
recorded while the removal it waited for is still under way would be one
whose worktrees the sweep goes on removing. The fake git says when each
removal begins and ends, the trace when each wait begins and its submit.
"""

from __future__ import annotations

import collections
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from herdsman.runtime.worktrees.slug import conversation_slug

__all__ = ["RemovalWaits", "draw_follow_up_on_removal"]


class RemovalWaits:
    """Removals under way (from the fake git) against the waits the trace tells of.

    ``fail(kind, message)`` records a violation (``Checker.fail``).
    """

    def __init__(self, fail: Callable[[str, str], None]) -> None:
        self._fail = fail
        # A conversation's folder of worktrees -> its removals under way.
        self._under_way: collections.Counter[str] = collections.Counter()
        # Runs traced as waiting whose submit is not traced yet -> their folder.
        self._waiting: dict[str, str] = {}

    def began(self, path: Path) -> None:
        """The fake git starts removing the worktree at ``path``."""
        self._under_way[path.parent.name] += 1

    def ended(self, path: Path) -> None:
        """The removal of ``path`` is over (done, failed, or cut short by a crash)."""
        folder = path.parent.name
        self._under_way[folder] -= 1
        if self._under_way[folder] <= 0:
            del self._under_way[folder]

    def wait(self, run: Mapping[str, Any]) -> None:
        """The trace's ``removal_wait`` of ``run`` (as the client sent it)."""
        conversation = run.get("conversation")
        if conversation is None:
            self._fail("removal wait", f"{run['id']} waited for a removal with no conversation")
            return
        folder = conversation_slug(run.get("workspace", "default"), conversation)
        if not self._under_way[folder]:
            self._fail(
                "removal wait",
                f"{run['id']} was traced waiting for a removal of {conversation}'s worktrees,"
                " and none was under way",
            )
        self._waiting[run["id"]] = folder

    def submitted(self, run_id: str) -> None:
        """The trace's ``submit`` of ``run_id``: the removal it waited for must be over."""
        folder = self._waiting.pop(run_id, None)
        if folder is not None and self._under_way[folder]:
            self._fail(
                "removal wait",
                f"{run_id} was recorded while the removal it waited for was still under way",
            )

    def crashed(self) -> None:
        """The supervisor died: the submits that were waiting died with it."""
        self._waiting.clear()


def draw_follow_up_on_removal(
    seed: int, events: list[dict[str, Any]], repos: int, latency: float
) -> None:
    """Mark, for some seeds, one follow-up submit as sent once its conversation is being swept.

    The fault: a client sends the follow-up (``"on_removal": true`` on its
    submit event) the moment a removal of its conversation's worktrees
    begins, at or after its time, so that the supervisor makes it wait
    (``removal_wait``); if none begins, it is never sent. Only with
    repositories and a git that takes time (else a removal is over before
    anyone could ask), in half those seeds. Drawn from a stream of its own
    (``Random("on removal:SEED")``): every other draw of the seed stays.
    """
    rng = random.Random(f"on removal:{seed}")
    if not repos or not latency or rng.random() >= 0.5:
        return
    seen: set[tuple[str, str]] = set()
    follow_ups = []
    for event in events:
        if event["kind"] != "submit" or event.get("again"):
            continue
        run = event["run"]
        if run.get("conversation") is None:
            continue
        key = (run.get("workspace", "default"), run["conversation"])
        if key in seen and event.get("on_busy", "queue") == "queue":
            follow_ups.append(event)
        seen.add(key)
    if follow_ups:
        rng.choice(follow_ups)["on_removal"] = True
